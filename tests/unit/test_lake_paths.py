"""The mapping of source names to lakehouse paths: ordinary names keep
their paths, every name maps to one safe segment, the mapping is injective and inverted,
and no source table lands among the project's own tables."""

from __future__ import annotations

import random
import unicodedata

import pytest

from pgcdc_dagster.capture.incremental_state import state_file
from pgcdc_dagster.lake.paths import (
    INTERNAL,
    decode_segment,
    encode_segment,
    internal_uri,
    probe_prefix,
    slot_root,
    table_names,
    table_segments,
    table_uri,
)

ORDINARY = ["public", "orders", "Orders", "OrderLines", "order_lines", "order-lines", "t1",
            "2024_sales", "v1.2", "$tmp", "x" * 63, "é名", "Ärger"]
HOSTILE = ["..", ".", "a/b", "a%2Fb", "a~2Fb", "a\\b", " lead", "trail ", "a b", "%", "~",
           "_pgcdc", "_PGCDC", "_PgCdc", "~5Fpgcdc", "it's", 'say "hi"', "a`b", "a*b?",
           "[x]", "{y}", "a|b^c", "#frag", "q?x=1", "\x00\x01\x1f\x7f", "\u00a0nbsp",
           "\u202eevil", "", ".hidden", "dot.", "CON", "a:b", "\ud800"]
# Characters to build names from: the dangerous ones, case pairs, - and _, non-ASCII.
ALPHABET = [*"aAbB_-.$/\\%~ :*?[]{}|^#'\"`\t\n", "\x00", "\x7f", "é", "É", "名", "\u00a0",
            "\u200b", "\U0001f600"]


def _names(n: int, seed: int = 18) -> list[str]:
    rng = random.Random(seed)
    out = set(ORDINARY + HOSTILE)
    while len(out) < n:
        out.add("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8))))
    return sorted(out)


def _safe(segment: str) -> None:
    """A segment every local file system, object store, delta-rs and Spark reads as one
    plain directory name."""
    assert segment and segment not in (".", "..") and not segment.startswith(".")
    assert not segment.endswith((".", " ")) and not segment.startswith(" ")
    assert not set(segment) & set("/\\%:*?[]{}|^#'\"`<> \t\n"), segment
    assert all(unicodedata.category(c)[0] not in "CZ" for c in segment), segment
    assert len(segment.encode()) <= 255


def test_ordinary_names_keep_their_paths() -> None:
    for name in ORDINARY:
        assert encode_segment(name) == name
    assert table_uri("/lake", "bronze", "public", "orders") == "/lake/bronze/public/orders"
    assert table_uri("s3://b/lake/", "silver", "Sales", "order-lines") == \
        "s3://b/lake/silver/Sales/order-lines"
    assert state_file("public", "orders") == "public.orders.json"


def test_examples_as_documented() -> None:
    assert table_segments("..", "..") == ("~2E~2E", "~2E~2E")
    assert table_segments("a/b", "a%2Fb") == ("a~2Fb", "a~252Fb")
    assert table_segments("_pgcdc", "schema_history") == ("~5Fpgcdc", "schema_history")
    assert encode_segment("my table") == "my~20table"
    assert encode_segment("") == "~"


def test_round_trip_injective_and_safe_over_generated_names() -> None:
    names = _names(6000)
    segments = {}
    for name in names:
        seg = encode_segment(name)
        _safe(seg)
        assert decode_segment(seg) == name
        assert segments.setdefault(seg, name) == name, (seg, name)
    # Pairs: distinct (schema, table) never share a path, and the inverse recovers them.
    rng = random.Random(4)
    pairs = {(rng.choice(names), rng.choice(names)) for _ in range(20000)}
    pairs |= {(n, "t") for n in HOSTILE} | {("s", n) for n in HOSTILE}
    paths: dict[tuple[str, str], tuple[str, str]] = {}
    for schema, table in pairs:
        segs = table_segments(schema, table)
        assert paths.setdefault(segs, (schema, table)) == (schema, table)
        assert table_names(*segs) == (schema, table)
        assert segs[0].lower() != INTERNAL  # never among the project's own tables


def test_names_differing_only_in_case_or_dash_stay_apart() -> None:
    for group in (["Orders", "orders", "ORDERS"], ["a-b", "a_b", "a~2Db", "a%2Db"],
                  ["_pgcdc", "_PGCDC", "~5Fpgcdc", "%5Fpgcdc"]):
        assert len({table_segments(n, n) for n in group}) == len(group)


def test_internal_paths_unchanged_and_out_of_reach() -> None:
    assert internal_uri("/lake", "schema_history") == "/lake/bronze/_pgcdc/schema_history"
    assert slot_root("/lake", "pgcdc_slot") == "/lake/_pgcdc/pgcdc_slot"
    for schema in ["_pgcdc", "_PGCDC", "_Pgcdc", "~5Fpgcdc", "_pgcdc ", "_pgcdc/."]:
        for table in ["schema_history", "messages", "transactions"]:
            assert table_uri("/lake", "bronze", schema, table) != internal_uri("/lake", table)
            assert not table_uri("/lake", "bronze", schema, table).lower().startswith(
                "/lake/bronze/_pgcdc/")
    with pytest.raises(ValueError, match="no source table"):
        table_names("_pgcdc", "messages")


def test_no_slot_state_shares_the_commit_probe_directory() -> None:
    """PostgreSQL slot names are ``[a-z0-9_]{1,63}``; none maps onto the probe's segment."""
    assert probe_prefix("/lake") == "/lake/_pgcdc/~commit_probe"
    for slot in ("commit_probe", "_commit_probe", "commit_probe_", "x" * 63):
        assert not probe_prefix("/lake").startswith(slot_root("/lake", slot))
        assert not slot_root("/lake", slot).startswith(probe_prefix("/lake"))


def test_longest_names_fit_file_names() -> None:
    worst = "\x01" * 63  # 63 bytes, each escaped
    assert len(encode_segment(worst).encode()) == 189
    files = {state_file(a, b) for a in (worst, "a.b", "a") for b in (worst, "c", "b.c")}
    assert len(files) == 9 and all(len(f.encode()) <= 255 for f in files)
    assert state_file("a.b", "c") != state_file("a", "b.c")


def test_unwritable_lakehouse_is_a_configuration_error_naming_the_fix(tmp_path) -> None:
    """A lakehouse root that cannot be created (under a file, say) stops the run with an
    error naming the path and PGCDC_LAKEHOUSE, not a bare NotADirectoryError."""
    import pyarrow as pa

    from pgcdc_dagster.exceptions import ConfigurationError
    from pgcdc_dagster.lake.delta import ensure_table

    (tmp_path / "afile").write_text("x")
    uri = internal_uri(str(tmp_path / "afile" / "lake"), "schema_history")
    with pytest.raises(ConfigurationError, match=r"(?s)afile/lake.*PGCDC_LAKEHOUSE"):
        ensure_table(uri, pa.schema([("a", pa.int64())]))
