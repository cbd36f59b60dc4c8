"""Silver is order-independent (design.md §3 decision 4; FT-10 replays
harmless, STR- delete / tombstone items): the events of a key reach silver in reverse order
across batches (an older event after a newer one, a replayed delete after a re-insert, a
delete before its insert, two events of one transaction swapped, a whole batch replayed), and
silver ends at each key's greatest sequence ``(commit LSN, ordinal)``; a tombstone stops a
late, older event from resurrecting a deleted key.

Bronze is built from hand-made change segments through the real bronze writer; each batch is
then applied by the real ``apply_silver`` (and so ``merge_batch``), with the batch prepared in
Arrow on the driver or by Spark.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.bronze_write import write_window
from pgcdc_dagster.capture.silver_apply import apply_silver
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.changes import Column, Relation, TableChanges, Window
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.lake.delta import ensure_table
from pgcdc_dagster.lake.silver import live_rows
from tests.support.segments import IDENT, text_context

pytestmark = pytest.mark.spark

REL = Relation(16500, "public", "ordered", "d", (
    Column("id", 23, -1, True), Column("title", 25, -1, False), Column("body", 25, -1, False)))


@pytest.fixture(params=["arrow", "spark"])
def engine(request) -> int:
    """Silver batches prepared in Arrow on the driver, or by Spark: same results."""
    return 10**9 if request.param == "arrow" else 0


def _ctx(lakehouse) -> TableContext:
    return text_context(lakehouse, REL, not_null=("id",))


@dataclass(frozen=True)
class Ev:
    """One change of key ``id`` at sequence ``(commit, ordinal)``."""

    op: str
    id: int
    commit: int
    ordinal: int = 1
    title: str | None = None
    body: str | None = None


def _segment(events: list[Ev]) -> TableChanges:
    seg = TableChanges(REL)
    for e in events:
        image = (str(e.id).encode(), None if e.title is None else e.title.encode(),
                 None if e.body is None else e.body.encode())
        seg.op.append(e.op)
        seg.commit_lsn.append(e.commit)
        seg.lsn.append(e.commit - 100 + e.ordinal)
        seg.xid.append(e.commit)
        seg.commit_ts_us.append(1_700_000_000_000_000 + e.commit)
        seg.total_order.append(e.ordinal)
        seg.collection_order.append(e.ordinal)
        if e.op == "d":
            seg.before.append((str(e.id).encode(), None, None))
            seg.before_key_only.append(True)
            seg.after.append(None)
        else:
            seg.before.append(None)
            seg.before_key_only.append(False)
            seg.after.append(image)
        seg.truncate_options.append(0)
    return seg


def _batch(lakehouse, spark, engine: int, number: int, *segments: list[Ev]) -> None:
    """Commit the segments as bronze window ``number`` and apply it to silver.

    Window ends are small (``number``) so that no event, whatever its commit LSN, counts as
    already committed: bronze keeps every event, and silver sees them in this order.
    """
    ctx = _ctx(lakehouse)
    ensure_table(ctx.bronze_uri, ctx.bronze_schema)
    window = Window(tables={REL.qualified: [_segment(s) for s in segments]})
    convs = list(ctx.converters)
    write_window(window, Lsn(number), {REL.qualified: ctx}, lambda rel: convs, IDENT)
    apply_silver(ctx, spark, engine)


def _expected(events: list[Ev]) -> dict[int, tuple]:
    """Per key, the event with the greatest sequence: the state silver must hold."""
    best: dict[int, Ev] = {}
    for e in events:
        if e.id not in best or (e.commit, e.ordinal) > (best[e.id].commit, best[e.id].ordinal):
            best[e.id] = e
    return {k: (e.op == "d", e.commit, e.ordinal, None if e.op == "d" else (e.title, e.body))
            for k, e in best.items()}


def _silver_state(lakehouse) -> dict[int, tuple]:
    rows = DeltaTable(_ctx(lakehouse).silver_uri).to_pyarrow_table().to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "a key twice in silver"
    return {r["id"]: (r["__deleted"], r["__commit_lsn"], r["__ordinal"],
                      None if r["__deleted"] else (r["title"], r["body"])) for r in rows}


NEWER = [  # batch 1: the newest event of each key
    Ev("u", 1, 500, title="v3", body="b3"),
    Ev("c", 2, 100, title="two", body="b"), Ev("d", 2, 400),
    Ev("c", 3, 100, title="three", body="b"), Ev("d", 3, 200),
    Ev("c", 3, 300, title="three again", body="b again"),
    Ev("d", 4, 600),
    Ev("u", 5, 700, ordinal=2, title="second of txn", body="b2"),
]
OLDER = [  # batch 2: older events of the same keys, arriving afterwards
    [Ev("c", 1, 100, title="v1", body="b1"), Ev("u", 1, 300, title="v2", body="b2")],
    [Ev("u", 2, 200, title="two late", body="late")],  # older than the delete at 400
    [Ev("d", 3, 200)],  # the delete replayed after the re-insert at 300
    [Ev("c", 4, 100, title="four", body="b")],  # the insert after its delete
    [Ev("u", 5, 700, ordinal=1, title="first of txn", body="b1")],
]


def test_older_events_after_newer_ones_leave_the_greatest_sequence(spark, lakehouse,
                                                                   engine) -> None:
    _batch(lakehouse, spark, engine, 10, NEWER)
    want = _expected(NEWER)
    assert _silver_state(lakehouse) == want

    # Within one batch too: segments in descending sequence (the newest first).
    _batch(lakehouse, spark, engine, 20, *reversed(OLDER))
    everything = NEWER + [e for seg in OLDER for e in seg]
    assert _expected(everything) == want  # nothing in batch 2 is newer
    assert _silver_state(lakehouse) == want
    live = {r["id"]: (r["title"], r["body"]) for r in live_rows(_ctx(lakehouse).silver_uri)
            .to_pylist()}
    assert live == {1: ("v3", "b3"), 3: ("three again", "b again"),
                    5: ("second of txn", "b2")}

    # A whole batch replayed, then genuinely newer events: a re-insert of a deleted key
    # (tombstone superseded), an update, and a delete.
    _batch(lakehouse, spark, engine, 30, NEWER)
    assert _silver_state(lakehouse) == want
    newest = [Ev("c", 2, 900, title="two reborn", body="r"), Ev("u", 1, 900, ordinal=2,
              title="v4", body="b4"), Ev("d", 5, 900, ordinal=3)]
    _batch(lakehouse, spark, engine, 40, newest)
    final = _expected(everything + NEWER + newest)
    assert _silver_state(lakehouse) == final
    assert final[2] == (False, 900, 1, ("two reborn", "r")) and final[5][0]

    # And the older events once more, after all of it: still nothing moves.
    _batch(lakehouse, spark, engine, 50, *OLDER)
    assert _silver_state(lakehouse) == final
