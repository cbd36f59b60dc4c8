"""YugabyteDB's REPLICA IDENTITY CHANGE (seed 003, YB-02, YB-04, YB-05).

No YugabyteDB server can run here, so the stream is built as the protocol messages
``yboutput`` sends, from the YugabyteDB documentation and its Debezium connector's tests
(``YugabyteReplicaIdentityIT``): pgoutput's protocol, the Relation message's replica identity
``c`` for CHANGE, an INSERT with every column, an UPDATE with the key and only the changed
columns (the others as tuple kind ``'u'``, not sent; a column set to NULL as ``'n'``), no old
tuple on UPDATE, and a DELETE with the key only. The messages go through the project's own
pgoutput assembler, bronze writer and silver MERGE, in both silver engines (Arrow on the
driver and Spark): silver merges the partial rows column by column, never takes an absent
column for NULL, and bronze lists per event the columns that were absent
(``__toast_unchanged``), fixed-width columns included.
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.bronze_write import write_window
from pgcdc_dagster.capture.silver_apply import apply_silver
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.pgoutput.assembler import Assembler
from pgcdc_dagster.cdc.plugins.pgwire import (
    MISSING,
    TableInfo,
    WindowMessages,
    begin,
    commit,
    relation_of,
)
from pgcdc_dagster.lake.delta import ensure_table
from pgcdc_dagster.lake.silver import live_rows
from tests.support.segments import IDENT, text_context

pytestmark = pytest.mark.spark

# CREATE TABLE s2.a (pk int PRIMARY KEY, aa int, bb text, cc int); ALTER ... REPLICA IDENTITY CHANGE
TABLE = TableInfo(relation_of(16500, "public", "a", "c", [
    ("pk", 23, -1, True), ("aa", 23, -1, False), ("bb", 25, -1, False), ("cc", 23, -1, False)]),
    frozenset({"bb"}))
ALL_ABSENT = {"aa": MISSING, "bb": MISSING, "cc": MISSING}


@pytest.fixture(params=["arrow", "spark"])
def engine(request) -> int:
    return 10**9 if request.param == "arrow" else 0


def _window(changes: list[tuple[str, dict, dict | None]], start: int):
    """One transaction per change, as yboutput would send them."""
    out = WindowMessages({("public", "a"): TABLE})
    asm = Assembler()
    lsn = start
    for op, new, old in changes:
        commit_lsn = lsn + 8
        asm.feed(lsn, begin(commit_lsn, 1_700_000_000_000_000, 900 + lsn))
        msgs = (out.insert(TABLE, new) if op == "c" else out.update(TABLE, new, old)
                if op == "u" else out.delete(TABLE, old or {}))
        for msg in msgs:
            asm.feed(lsn + 1, msg)
        asm.feed(commit_lsn, commit(commit_lsn, commit_lsn + 2, 1_700_000_000_000_000))
        lsn += 16
    return asm.finish(), lsn


def _apply(lakehouse, spark, engine, changes, start):
    ctx = text_context(lakehouse, TABLE.relation, not_null=("pk",))
    ensure_table(ctx.bronze_uri, ctx.bronze_schema)
    window, end = _window(changes, start)
    convs = list(ctx.converters)
    write_window(window, Lsn(end), {TABLE.relation.qualified: ctx}, lambda rel: convs, IDENT)
    apply_silver(ctx, spark, engine)
    silver = {r["pk"]: r for r in live_rows(ctx.silver_uri).to_pylist()}
    return ctx, silver


def test_partial_updates_merge_column_wise(spark, lakehouse, engine) -> None:
    ctx, silver = _apply(lakehouse, spark, engine, [
        ("c", {"pk": "1", "aa": "22", "bb": "random text value", "cc": "7"}, None),
        ("c", {"pk": "2", "aa": "1", "bb": "two", "cc": "2"}, None),
        ("u", {**ALL_ABSENT, "pk": "1", "aa": "12345"}, None),   # only aa changed
    ], 1000)
    assert silver[1]["aa"] == 12345 and silver[1]["bb"] == "random text value" \
        and silver[1]["cc"] == 7

    # a later batch: an explicit NULL is NULL, absent columns keep their values, several
    # partial updates of one key in one batch combine (each column from its latest change)
    _, silver = _apply(lakehouse, spark, engine, [
        ("u", {**ALL_ABSENT, "pk": "1", "aa": None}, None),        # SET aa = NULL
        ("u", {**ALL_ABSENT, "pk": "2", "cc": "20"}, None),
        ("u", {**ALL_ABSENT, "pk": "2", "bb": "two v2"}, None),
        ("u", {**ALL_ABSENT, "pk": "2", "cc": None}, None),
        ("c", {"pk": "3", "aa": "3", "bb": "three", "cc": "3"}, None),
        ("d", {}, {"pk": "3"}),                                     # key only
    ], 2000)
    assert silver[1]["aa"] is None and silver[1]["bb"] == "random text value" \
        and silver[1]["cc"] == 7
    assert silver[2]["aa"] == 1 and silver[2]["bb"] == "two v2" and silver[2]["cc"] is None
    assert set(silver) == {1, 2}

    # bronze: the absent columns of each event are listed; before is null (no old tuple)
    rows = sorted(DeltaTable(ctx.bronze_uri).to_pyarrow_table().to_pylist(),
                  key=lambda r: (r["__commit_lsn"], r["__ordinal"]))
    updates = [r for r in rows if r["op"] == "u"]
    assert [sorted(r["__toast_unchanged"]) for r in updates] == [
        ["bb", "cc"], ["bb", "cc"], ["aa", "bb"], ["aa", "cc"], ["aa", "bb"]]
    assert all(r["before"] is None for r in updates)
    set_null = updates[1]
    assert set_null["after"]["aa"] is None and "aa" not in set_null["__toast_unchanged"]
    delete = next(r for r in rows if r["op"] == "d")
    assert delete["before"]["pk"] == 3 and delete["after"] is None
