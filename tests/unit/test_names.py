"""The Dagster names of source tables (pgcdc_dagster.names): valid, injective, inverse,
ordinary names unchanged."""

from __future__ import annotations

import itertools
import random

import pytest
from dagster._core.definitions.partitions.utils.base import INVALID_PARTITION_SUBSTRINGS
from dagster._core.definitions.utils import has_valid_name_chars, is_valid_name
from dagster._utils.tags import is_valid_strict_tag_value

from pgcdc_dagster import names

pytestmark = pytest.mark.unit

HOSTILE = ["my table", 'q"uote', "it's", "sl/ash", "back\\slash", "café", "日本", "..", ".",
           "a-b", "a_b", "a.b", "A", "a", "_pgcdc", "x__old", "x__a_2d_b", "x__", "_", "__",
           "a__b", "_b", "a_", "tab\there", "new\nline", "a...b", "%41", "e" * 63, "é" * 31,
           "emoji\U0001F600", " lead", "trail ", "select", "type", "0digit", "a,b", "[x]"]
ORDINARY = ["orders", "Order_Items", "a_b", "A", "a", "_airbyte_raw", "__EFMigrationsHistory",
            "stg__orders", "t1", "0digit", "select", "type", "x_y", "x_", "xx__y"]


def _random_names(n: int) -> list[str]:
    rng = random.Random(18)
    alphabet = "aAb_x-. \"'/\\é日%\t" + "0123456789"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(n)]


def test_ordinary_names_keep_todays_keys() -> None:
    for name in ORDINARY:
        assert names.key_component(name) == name
        assert names.asset_path("bronze", "public", name) == ["bronze", "public", name]
    assert names.partition_key("public", "orders") == "public.orders"
    assert names.partition_key("my.schema", 'a"b') == '"my.schema"."a""b"'  # today's quoting
    assert names.partition_key("public", "my table") == "public.my table"


def test_components_are_valid_injective_and_invertible() -> None:
    pool = sorted(set(HOSTILE + ORDINARY + _random_names(3000)))
    components = {}
    for name in pool:
        comp = names.key_component(name)
        assert has_valid_name_chars(comp), (name, comp)
        assert names.name_of_component(comp) == name
        assert comp not in components, (name, components.get(comp))
        components[comp] = name
    for reserved in ("_pgcdc", "x__old"):  # never their own component
        assert names.key_component(reserved).startswith("x__")
    assert names.key_component("a-b") != names.key_component("a_b")
    assert names.key_component("A") != names.key_component("a")


@pytest.mark.parametrize("bad", ["x__ab", "x__a_61_", "x__a_zz_", "x__a_2d", "a-b", "",
                                 "x____pgcdc_"])
def test_non_canonical_components_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        names.name_of_component(bad)


def test_identifiers_are_valid_and_injective() -> None:
    pool = HOSTILE + ORDINARY + _random_names(300)
    pairs = list(itertools.product(pool[:60], pool[:60])) + [(s, "t") for s in pool]
    seen: dict[str, tuple[str, str]] = {}
    for schema, table in pairs:
        ident = names.identifier("bronze", schema, table)
        assert is_valid_name(ident), ident
        assert seen.setdefault(ident, (schema, table)) == (schema, table)
    # the pairs whose Dagster-derived names collide (both joins) get distinct identifiers
    assert names.identifier("bronze", "sales_eu", "orders") == "bronze__sales_eu__orders"
    assert names.identifier("bronze", "a__b", "c") != names.identifier("bronze", "a", "b__c")
    assert names.identifier("bronze", "a_", "b") != names.identifier("bronze", "a", "_b")


def test_path_round_trip() -> None:
    for schema, table in [("public", "orders"), ("..", ".."), ("_pgcdc", "messages"),
                          ("s p", "日本")]:
        path = names.asset_path("silver", schema, table)
        assert names.table_of_path(path) == (schema, table)
    assert names.asset_path("bronze", "_pgcdc", "messages") != ["bronze", "_pgcdc", "messages"]
    with pytest.raises(ValueError):
        names.table_of_path(["source", "replication_slot"])


def test_partition_keys_are_valid_injective_and_invertible() -> None:
    pool = HOSTILE + _random_names(200)
    seen: dict[str, tuple[str, str]] = {}
    for schema, table in itertools.product(pool[:50], pool):
        key = names.partition_key(schema, table)
        assert not any(bad in key for bad in INVALID_PARTITION_SUBSTRINGS), key
        assert names.partition_table(key) == (schema, table)
        assert seen.setdefault(key, (schema, table)) == (schema, table)
    assert names.partition_key("public", "a...b").startswith(".")
    with pytest.raises(ValueError):
        names.partition_table("no_dot")


def test_tag_values() -> None:
    assert names.tag_value("orders") == "orders"
    assert names.tag_value("a-b") == "a-b"
    for bad in ("my table", "café", "e" * 64, 'q"'):
        assert names.tag_value(bad) is None
    for name in HOSTILE:
        value = names.tag_value(name)
        assert value is None or is_valid_strict_tag_value(value)


def test_table_ids_keep_ordinary_names_and_are_injective() -> None:
    """The engine's text identity of a table: ``"a.b".c`` and ``a."b.c"`` apart."""
    assert names.table_id("public", "orders") == "public.orders"
    assert names.table_id("a.b", "c") == '"a.b".c'
    assert names.table_id("a", "b.c") == 'a."b.c"'
    assert names.table_id("%s", "{}") == "%s.{}"
    pool = [*HOSTILE, "", "a.b.c", '"', '""', "a.", ".b", *_random_names(200)]
    seen: dict[str, tuple[str, str]] = {}
    for schema, table in itertools.product(pool[:60], pool):
        ident = names.table_id(schema, table)
        assert names.parse_table_id(ident) == (schema, table), ident
        assert names.parse_table_id(f"  {ident} ") == (schema, table)
        assert seen.setdefault(ident, (schema, table)) == (schema, table)
    for schema, table in itertools.product(ORDINARY, ORDINARY):
        assert names.table_id(schema, table) == f"{schema}.{table}"


def test_unquoted_dotted_names_are_ambiguous_unless_one_table_reads_so() -> None:
    with pytest.raises(ValueError, match=r'ambiguous.*a\."b\.c" or "a\.b"\.c'):
        names.parse_table_id("a.b.c")
    with pytest.raises(ValueError, match=r"not <schema>\.<table>"):
        names.parse_table_id("nodot")
    assert names.resolve_table_id("a.b.c", [("a.b", "c"), ("x", "y")]) == ("a.b", "c")
    with pytest.raises(ValueError, match="ambiguous"):
        names.resolve_table_id("a.b.c", [("a.b", "c"), ("a", "b.c")])
    assert names.resolve_table_id('"a.b".c', [("a.b", "c"), ("a", "b.c")]) == ("a.b", "c")
    assert names.splits("a.b.c") == [("a", "b.c"), ("a.b", "c")]
