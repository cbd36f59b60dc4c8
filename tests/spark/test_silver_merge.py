"""Silver semantics on real Spark and Delta (design.md §3 decision 4; STR- TOAST, PK change,
truncate; FT-10 replays harmless). Bronze is built from hand-made change segments, so these
tests pin the sink independently of the decoder."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.bronze_write import write_window
from pgcdc_dagster.capture.silver_apply import apply_silver
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST, Column, Relation, TableChanges, Window
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.lake.data_files import read_file, stored_files
from pgcdc_dagster.lake.delta import ensure_table
from pgcdc_dagster.lake.silver import live_rows
from tests.support.delta_log import last_commit_files
from tests.support.segments import IDENT, SegmentBuilder, text_context

pytestmark = pytest.mark.spark


@pytest.fixture(params=["arrow", "spark"])
def engine(request) -> int:
    """Silver batches prepared in Arrow on the driver, or by Spark: same results."""
    return 10**9 if request.param == "arrow" else 0


REL = Relation(16400, "public", "docs", "d", (
    Column("id", 23, -1, True), Column("title", 25, -1, False), Column("body", 25, -1, False)))


def _ctx(lakehouse) -> TableContext:
    return text_context(lakehouse, REL, not_null=("id",))


class Seg(SegmentBuilder):
    """Builds a TableChanges segment of ``docs``; each call is one event in its own
    transaction."""

    def __init__(self) -> None:
        super().__init__(REL)


def _write(lakehouse, seg: TableChanges, upto: int) -> None:
    ctx = _ctx(lakehouse)
    ensure_table(ctx.bronze_uri, ctx.bronze_schema)
    window = Window(tables={REL.qualified: [seg]})
    convs = list(ctx.converters)
    write_window(window, Lsn(upto), {REL.qualified: ctx}, lambda rel: convs, IDENT)


def _silver(lakehouse) -> dict[int, dict]:
    return {r["id"]: r for r in live_rows(_ctx(lakehouse).silver_uri).to_pylist()}


def test_toast_pk_change_delete_and_replay(spark, lakehouse, engine) -> None:
    b = Seg()
    b.add("c", after=(b"1", b"one", b"x" * 5000))
    b.add("c", after=(b"2", b"two", b"long body two"))
    b.add("c", after=(b"3", b"three", b"body three"))
    _write(lakehouse, b.seg, 2000)
    apply_silver(_ctx(lakehouse), spark, engine)
    assert _silver(lakehouse)[1]["body"] == "x" * 5000

    b2 = Seg()
    b2.lsn = 3000
    # unchanged TOAST body: the stored value must survive (never the placeholder)
    b2.add("u", after=(b"1", b"one v2", UNCHANGED_TOAST))
    # within one batch: full value first, then an unchanged-TOAST update of the same key
    b2.add("u", after=(b"2", b"two v2", b"new body two"))
    b2.add("u", after=(b"2", b"two v3", UNCHANGED_TOAST))
    # primary-key change 3 -> 30 (K old tuple): a delete of 3 and a create of 30
    b2.add("u", before=(b"3", None, None), after=(b"30", b"thirty", b"body 30"), key_only=True)
    b2.add("c", after=(b"4", b"four", b"b4"))
    b2.add("d", before=(b"4", None, None), key_only=True)
    _write(lakehouse, b2.seg, 4000)
    report = apply_silver(_ctx(lakehouse), spark, engine)
    assert report.events == 7  # the key change is two events
    silver = _silver(lakehouse)
    assert set(silver) == {1, 2, 30}
    assert silver[1]["title"] == "one v2" and silver[1]["body"] == "x" * 5000
    assert silver[2]["title"] == "two v3" and silver[2]["body"] == "new body two"
    assert silver[30]["body"] == "body 30"
    bronze = DeltaTable(_ctx(lakehouse).bronze_uri).to_pyarrow_table()
    toast_row = bronze.filter(pa.compute.equal(bronze["__commit_lsn"], 3010)).to_pylist()[0]
    assert toast_row["after"]["body"] == "__debezium_unavailable_value"
    assert toast_row["__toast_unchanged"] == ["body"]

    # A replay of old events (e.g. bronze rewritten) cannot move silver backwards.
    before = _silver(lakehouse)
    _write(lakehouse, b.seg, 5000)  # exactly-once: the window <= 4000 is skipped
    assert DeltaTable(_ctx(lakehouse).bronze_uri).to_pyarrow_table().num_rows == 10
    ctx = _ctx(lakehouse)
    silver = DeltaTable(ctx.silver_uri)
    silver.delete(predicate="true")  # force a full replay of bronze into an empty silver
    replayed = TableContext(ctx.relation, ctx.converters, ctx.bronze_uri, ctx.silver_uri,
                            ctx.bronze_app_id, "t:silver-replay")
    apply_silver(replayed, spark, engine)
    assert _silver(lakehouse) == before
    tombstones = DeltaTable(ctx.silver_uri).to_pyarrow_table().filter(
        pa.compute.field("__deleted")).to_pylist()
    assert sorted(r["id"] for r in tombstones) == [3, 4]


def test_truncate_empties_silver_and_later_rows_survive(spark, lakehouse, engine) -> None:
    b = Seg()
    b.add("c", after=(b"1", b"a", b"a"))
    b.add("c", after=(b"2", b"b", b"b"))
    b.add("t")
    b.add("c", after=(b"3", b"c", b"c"))
    _write(lakehouse, b.seg, 2000)
    apply_silver(_ctx(lakehouse), spark, engine)
    assert set(_silver(lakehouse)) == {3}
    b2 = Seg()
    b2.lsn = 3000
    b2.add("t")
    _write(lakehouse, b2.seg, 4000)
    report = apply_silver(_ctx(lakehouse), spark, engine)
    assert report.counts["deleted_by_truncate"] == 1
    assert _silver(lakehouse) == {}


def test_key_change_with_unchanged_toast_takes_the_old_keys_value(spark, lakehouse, engine,
                                                                  caplog) -> None:
    """A primary-key change under REPLICA IDENTITY DEFAULT leaves the new key's TOAST column
    as the placeholder (STR-48, IMP-06): silver takes the old key's value from silver, from
    the batch, through chains of key changes, never from before a delete; only a value that
    exists nowhere stays the placeholder, with a warning."""
    b = Seg()
    b.add("c", after=(b"1", b"one", b"x" * 5000))
    _write(lakehouse, b.seg, 2000)
    apply_silver(_ctx(lakehouse), spark, engine)

    b2 = Seg()
    b2.lsn = 3000
    k = {"key_only": True}
    b2.add("u", before=(b"1", None, None), after=(b"10", b"ten", UNCHANGED_TOAST), **k)
    b2.add("c", after=(b"5", b"five", b"body five"))
    b2.add("u", after=(b"5", b"five v2", UNCHANGED_TOAST))
    b2.add("u", before=(b"5", None, None), after=(b"50", b"fifty", UNCHANGED_TOAST), **k)
    b2.add("u", before=(b"50", None, None), after=(b"60", b"sixty", UNCHANGED_TOAST), **k)
    b2.add("c", after=(b"2", b"two", b"old two"))
    b2.add("d", before=(b"2", None, None), **k)
    b2.add("c", after=(b"8", b"eight", b"body eight"))
    b2.add("u", before=(b"8", None, None), after=(b"2", b"two again", UNCHANGED_TOAST), **k)
    b2.add("u", before=(b"99", None, None), after=(b"100", b"lost", UNCHANGED_TOAST), **k)
    _write(lakehouse, b2.seg, 4000)
    with caplog.at_level("WARNING", logger="pgcdc_dagster"):
        apply_silver(_ctx(lakehouse), spark, engine)
    silver = _silver(lakehouse)
    assert {i: r["body"] for i, r in silver.items()} == {
        10: "x" * 5000, 60: "body five", 2: "body eight", 100: "__debezium_unavailable_value"}
    assert silver[60]["title"] == "sixty" and silver[2]["title"] == "two again"
    warned = [r.getMessage() for r in caplog.records if "unchanged TOAST" in r.getMessage()]
    assert len(warned) == 1 and "'id': 100" in warned[0] and "body" in warned[0]


def _last_commit(lakehouse) -> tuple[set[str], set[str]]:
    """Paths the silver table's last commit removed and added (its Delta log entry)."""
    return last_commit_files(_ctx(lakehouse).silver_uri)


def _files_holding(lakehouse, keys: set[int]) -> set[str]:
    uri = _ctx(lakehouse).silver_uri
    return {f.path for f in stored_files(DeltaTable(uri), "id")
            if keys & set(read_file(uri, f.path, pa.schema([("id", pa.int32())]))["id"]
                          .to_pylist())}


def test_batches_rewrite_only_the_files_holding_their_keys(spark, lakehouse, engine) -> None:
    """A batch of new keys only adds files; a batch that changes stored keys (a live row, a
    tombstone) removes exactly the files holding them, and the sequence order and the
    tombstones keep their meaning (design.md §3 decision 4)."""
    b = Seg()
    b.add("c", after=(b"1", b"one", b"b1")).add("c", after=(b"2", b"two", b"b2"))
    _write(lakehouse, b.seg, 2000)
    apply_silver(_ctx(lakehouse), spark, engine)
    assert _last_commit(lakehouse)[0] == set()
    b2 = Seg()
    b2.lsn = 3000
    b2.add("c", after=(b"10", b"ten", b"b10")).add("d", before=(b"10", None, None), key_only=True)
    b2.add("c", after=(b"11", b"eleven", b"b11"))
    _write(lakehouse, b2.seg, 4000)
    apply_silver(_ctx(lakehouse), spark, engine)
    removed, added = _last_commit(lakehouse)
    assert removed == set() and len(added) == 1  # 10 and 11 are new: a tombstone of 10 added
    b2b = Seg()
    b2b.lsn = 4100
    b2b.add("c", after=(b"100", b"hundred", b"b100"))
    _write(lakehouse, b2b.seg, 4200)
    apply_silver(_ctx(lakehouse), spark, engine)
    holding = _files_holding(lakehouse, {2, 10})
    untouched = {f.path for f in stored_files(DeltaTable(_ctx(lakehouse).silver_uri), "id")
                 } - holding
    assert len(holding) == 2 and len(untouched) == 1  # 2 (with 1), 10 (with 11); not 100
    b3 = Seg()
    b3.lsn = 5000
    b3.add("c", after=(b"10", b"ten again", b"b10 again"))  # only its tombstone is stored
    b3.add("u", after=(b"2", b"two v2", UNCHANGED_TOAST))
    _write(lakehouse, b3.seg, 6000)
    apply_silver(_ctx(lakehouse), spark, engine)
    removed, added = _last_commit(lakehouse)
    assert removed == holding and len(added) == 2
    silver = _silver(lakehouse)
    assert {i: (r["title"], r["body"]) for i, r in silver.items()} == {
        1: ("one", "b1"), 2: ("two v2", "b2"), 10: ("ten again", "b10 again"),
        11: ("eleven", "b11"), 100: ("hundred", "b100")}
    rows = DeltaTable(_ctx(lakehouse).silver_uri).to_pyarrow_table()
    assert rows.num_rows == 5  # one row per key: the tombstone of 10 was updated, not doubled
