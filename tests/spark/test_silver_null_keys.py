"""Silver with nullable key columns (``message.key.columns`` on nullable columns), on real
Spark and Delta, for both silver preparers: NULL equals NULL (one key, as under ``NULLS NOT
DISTINCT``), greatest sequence wins within a batch and across batches, tombstones of NULL
keys hold, a full replay gives the same silver, and a silver table written when key columns
were declared NOT NULL is relaxed rather than refused."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.bronze_write import write_window
from pgcdc_dagster.capture.silver_apply import apply_silver
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.changes import Column, Relation, Window
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.lake.delta import ensure_table
from pgcdc_dagster.lake.silver import live_rows
from tests.support.delta_log import last_commit_files
from tests.support.segments import IDENT, SegmentBuilder, text_context

pytestmark = pytest.mark.spark

PAIR = Relation(16410, "public", "pair", "f", (
    Column("a", 23, -1, True), Column("b", 25, -1, True), Column("n", 23, -1, False)))
SINGLE = Relation(16411, "public", "single", "f", (
    Column("k", 23, -1, True), Column("n", 23, -1, False)))


@pytest.fixture(params=["arrow", "spark"])
def engine(request) -> int:
    """Silver batches prepared in Arrow on the driver, or by Spark: same results."""
    return 10**9 if request.param == "arrow" else 0


def _ctx(lakehouse, rel: Relation, app: str = "t:silver") -> TableContext:
    return text_context(lakehouse, rel, app=app)


def _b(v: object) -> bytes | None:
    return None if v is None else str(v).encode()


class Seg(SegmentBuilder):
    """A TableChanges segment; each event in its own transaction (REPLICA IDENTITY FULL)."""

    def __init__(self, rel: Relation, lsn: int) -> None:
        super().__init__(rel, lsn, encode=lambda row: tuple(_b(v) for v in row))


def _write(lakehouse, rel: Relation, seg: Seg, upto: int) -> None:
    ctx = _ctx(lakehouse, rel)
    ensure_table(ctx.bronze_uri, ctx.bronze_schema)
    convs = list(ctx.converters)
    write_window(Window(tables={rel.qualified: [seg.seg]}), Lsn(upto), {rel.qualified: ctx},
                 lambda r: convs, IDENT)


def _state(uri: str, keys: list[str]) -> tuple[dict[tuple, int], dict[tuple, bool]]:
    """Live rows (key -> n) and every stored key's ``__deleted``; each key stored once."""
    rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
    stored = [tuple(r[k] for k in keys) for r in rows]
    assert len(stored) == len(set(stored)), sorted(stored, key=repr)
    live = {tuple(r[k] for k in keys): r["n"] for r in live_rows(uri).to_pylist()}
    return live, {tuple(r[k] for k in keys): r["__deleted"] for r in rows}


def test_composite_null_keys_fold_merge_and_replay(spark, lakehouse, engine) -> None:
    ctx = _ctx(lakehouse, PAIR)
    # A silver table from before nullable keys: key columns NOT NULL. It is relaxed.
    old = pa.schema([f.with_nullable(False) if f.name in ("a", "b") else f
                     for f in ctx.silver_schema])
    ensure_table(ctx.silver_uri, old)
    s = Seg(PAIR, 1000)
    s.add("c", after=(None, "x", 1)).add("c", after=(1, None, 2))
    s.add("c", after=(None, None, 3)).add("c", after=(1, "x", 4))
    s.add("u", before=(None, None, 3), after=(None, None, 30))
    s.add("u", before=(None, "x", 1), after=(None, "x", 10))
    s.add("d", before=(1, None, 2))
    s.add("u", before=(1, "x", 4), after=(None, "y", 4))  # key change into NULL
    _write(lakehouse, PAIR, s, 2000)
    apply_silver(ctx, spark, engine)
    schema = pa.schema(DeltaTable(ctx.silver_uri).schema().to_arrow())
    assert schema.field("a").nullable and schema.field("b").nullable
    live, stored = _state(ctx.silver_uri, ["a", "b"])
    assert live == {(None, "x"): 10, (None, None): 30, (None, "y"): 4}
    assert stored[(1, None)] and stored[(1, "x")]  # tombstones

    s2 = Seg(PAIR, 3000)
    s2.add("u", before=(None, None, 30), after=(None, None, 31))
    s2.add("c", after=(1, None, 5))  # over its tombstone
    s2.add("d", before=(None, "x", 10)).add("c", after=(None, "x", 11))
    s2.add("d", before=(None, "y", 4))
    s2.add("u", before=(None, None, 31), after=(None, None, 32))
    _write(lakehouse, PAIR, s2, 4000)
    apply_silver(ctx, spark, engine)
    expected = {(None, "x"): 11, (None, None): 32, (1, None): 5}
    live, stored = _state(ctx.silver_uri, ["a", "b"])
    assert live == expected
    assert stored[(None, "y")] and stored[(1, "x")]

    # A full replay of bronze into an empty silver gives the same state (NULL keys too).
    DeltaTable(ctx.silver_uri).delete(predicate="true")
    apply_silver(_ctx(lakehouse, PAIR, "t:replay"), spark, engine)
    assert _state(ctx.silver_uri, ["a", "b"])[0] == expected
    # Replaying the first batch over newer silver changes nothing (greatest sequence wins).
    apply_silver(_ctx(lakehouse, PAIR, "t:replay-again"), spark, engine)
    assert _state(ctx.silver_uri, ["a", "b"])[0] == expected


def test_single_nullable_integer_key_and_the_append_shortcut(spark, lakehouse, engine) -> None:
    """New keys only add a file (file statistics rule the stored ones out), a stored NULL key
    does not change that, and a batch with a NULL key rewrites the file holding it only."""
    ctx = _ctx(lakehouse, SINGLE)
    s = Seg(SINGLE, 1000)
    s.add("c", after=(1, 1)).add("c", after=(None, 2)).add("c", after=(2, 3))
    _write(lakehouse, SINGLE, s, 2000)
    apply_silver(ctx, spark, engine)
    first = set(DeltaTable(ctx.silver_uri).get_add_actions(flatten=True)["path"].to_pylist())
    s2 = Seg(SINGLE, 3000)
    s2.add("c", after=(3, 4)).add("c", after=(4, 5))
    _write(lakehouse, SINGLE, s2, 4000)
    apply_silver(ctx, spark, engine)
    removed, added = last_commit_files(ctx.silver_uri)
    assert removed == set() and len(added) == 1
    s3 = Seg(SINGLE, 5000)
    s3.add("u", before=(None, 2), after=(None, 20)).add("c", after=(5, 6))
    _write(lakehouse, SINGLE, s3, 6000)
    apply_silver(ctx, spark, engine)
    removed, added = last_commit_files(ctx.silver_uri)
    assert removed == first and len(added) == 2  # the NULL key's file; 5 is a new file
    s4 = Seg(SINGLE, 7000)
    s4.add("d", before=(None, 20))
    _write(lakehouse, SINGLE, s4, 8000)
    apply_silver(ctx, spark, engine)
    live, stored = _state(ctx.silver_uri, ["k"])
    assert live == {(1,): 1, (2,): 3, (3,): 4, (4,): 5, (5,): 6}
    assert stored[(None,)] is True
