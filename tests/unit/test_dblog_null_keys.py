"""DBLog window dedup with NULL key columns (INC-10, INC-11): keys compare
NULL-equals-NULL, so an in-window change evicts exactly the chunk row with the same key
(NULLs in the same positions) and no other; the survivors sit at the high watermark."""

from __future__ import annotations

from pgcdc_dagster.cdc.changes import Column, LogicalMessage, Relation, TableChanges, Window
from pgcdc_dagster.cdc.dblog import WATERMARK_PREFIX, ChunkWindow, Watermark

REL = Relation(1, "public", "nk", "f", (Column("a", 23, -1, True), Column("b", 25, -1, True),
                                        Column("n", 23, -1, False)))
ROWS = [(b"1", None, b"x"), (None, b"k", b"y"), (None, None, b"z"), (b"1", b"k", b"w"),
        (None, b"j", b"v")]


def _events(*changes: tuple[str, tuple | None, tuple | None, int]) -> TableChanges:
    seg = TableChanges(REL)
    for i, (op, before, after, commit) in enumerate(changes):
        seg.op.append(op)
        seg.commit_lsn.append(commit)
        seg.lsn.append(commit - 1)
        seg.xid.append(700 + i)
        seg.commit_ts_us.append(0)
        seg.total_order.append(1)
        seg.collection_order.append(1)
        seg.before.append(before)
        seg.before_key_only.append(False)
        seg.after.append(after)
        seg.truncate_options.append(0)
    return seg


def test_null_keys_evict_only_their_own_row() -> None:
    chunk = ChunkWindow.from_rows("s", ("public", "nk"), 1, REL, ("a", "b"), ROWS, low_lsn=100)
    assert len(chunk.rows) == 5  # (NULL, NULL), (1, NULL), (NULL, 'k') … are distinct keys
    high = LogicalMessage(True, WATERMARK_PREFIX,
                          Watermark("s", "public.nk", 1, "high").encode().encode(), lsn=499,
                          commit_lsn=500, xid=9, commit_ts_us=0, total_order=1)
    window = Window(tables={("public", "nk"): [_events(
        ("u", (None, b"k", b"y"), (None, b"k", b"y2"), 200),   # evicts (NULL, 'k') only
        ("d", (None, None, b"z"), None, 300),                    # evicts (NULL, NULL) only
        ("u", (b"1", b"k", b"w"), (b"1", b"k", b"w"), 600),      # after the HW: ignored
        ("c", None, (b"2", None, b"q"), 50),                     # before the LW: ignored
    )]}, messages=[high])
    result = chunk.observe(window)
    assert result.closed and result.emitted == 3 and chunk.dropped == 2
    (survivors,) = result.segments
    assert sorted(survivors.after, key=repr) == sorted(
        [(b"1", None, b"x"), (b"1", b"k", b"w"), (None, b"j", b"v")], key=repr)
    assert set(survivors.commit_lsn) == {500} and set(survivors.lsn) == {499}
    assert set(survivors.op) == {"r"} and survivors.snapshot == "incremental"
