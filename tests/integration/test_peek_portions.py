"""peek_window in portions: bounded memory for huge transactions.

A transaction of 200,000 rows peeked with ``portion_changes=20_000`` goes out in portions of
exactly 20,000 rows while the COPY still streams; joined together they equal the window
peeked in one piece, column by column (STR-04: commit order, total and collection order;
STR-13: xid, commit time), and the memory the peek holds stays bounded by the portion.
Streamed transactions (protocol 2+) go out in portions at their Stream Commit; a streamed
transaction that has not committed in the window is never handed out.
"""

from __future__ import annotations

import gc
import tracemalloc

import psycopg2
import pytest

from pgcdc_dagster.cdc.changes import Window
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.postgres.peek import peek_window
from tests.support.portions import columns, merge_portions

pytestmark = pytest.mark.integration

PORTION = 20_000


def _lsn(cur) -> Lsn:
    cur.execute("SELECT pg_current_wal_flush_lsn()::text")
    return Lsn(cur.fetchone()[0])


def _setup(cur) -> None:
    cur.execute("SET synchronous_commit = on")
    cur.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric)")
    cur.execute("ALTER TABLE a REPLICA IDENTITY FULL")  # before images on every update
    cur.execute("CREATE TABLE b (id int PRIMARY KEY, w text)")
    cur.execute("CREATE PUBLICATION pub FOR TABLE a, b")
    cur.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")


def _huge_transaction(cur, big: int) -> None:
    """A small transaction, then one of ``big`` rows over two tables, then another small one."""
    cur.execute("INSERT INTO b VALUES (-1, 'before')")
    cur.execute("BEGIN")
    cur.execute("INSERT INTO a SELECT g, 'v' || g, g * 1.5 FROM generate_series(1, %s) g",
                (big * 3 // 4,))
    cur.execute("INSERT INTO b SELECT g, 'w' || g FROM generate_series(1, %s) g", (big // 20,))
    cur.execute("SELECT pg_logical_emit_message(true, 'inside', 'm')")
    cur.execute("UPDATE a SET n = n + 1 WHERE id <= %s", (big * 3 // 20,))
    cur.execute("DELETE FROM b WHERE id <= %s", (big // 20,))
    cur.execute("COMMIT")
    cur.execute("UPDATE b SET w = 'after' WHERE id = -1")


class Collector:
    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.portions: list[Window] = []
        self.sizes: list[int] = []

    def __call__(self, portion: Window) -> None:
        assert not portion.messages and not portion.transactions
        self.sizes.append(sum(len(seg) for seg in portion.segments()))
        if self.keep:
            self.portions.append(portion)


def test_huge_transaction_goes_out_in_portions_equal_to_the_whole(pg_conn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    big = 200_000
    _huge_transaction(cur, big)
    upto = _lsn(cur)

    whole = peek_window(pg_conn, "s", "pub", upto)
    assert whole.change_count == big + 1 + 2  # + the message, + the two small transactions
    collect = Collector()
    final = peek_window(pg_conn, "s", "pub", upto, portion_changes=PORTION, on_portion=collect)

    total_rows = sum(len(seg) for seg in whole.segments())
    assert collect.sizes == [PORTION] * (total_rows // PORTION)
    assert sum(len(seg) for seg in final.segments()) == total_rows % PORTION
    # The window's metadata is complete in the final window.
    assert final.transactions == whole.transactions
    assert final.messages == whole.messages
    assert final.change_count == whole.change_count
    assert final.last_commit_end_lsn == whole.last_commit_end_lsn
    assert final.slot_rows == whole.slot_rows > total_rows
    # Joined, the portions are the un-portioned window column by column.
    merged = merge_portions(collect.portions, final)
    assert columns(merged) == columns(whole)
    # Portions cut inside the big transaction, across both tables and every op.
    big_xid = whole.transactions[1].xid
    cut = [p for p in collect.portions if any(big_xid in seg.xid for seg in p.segments())]
    assert len(cut) >= 9
    assert {op for p in collect.portions for seg in p.segments() for op in seg.op} == \
        {"c", "u", "d"}


def test_portions_bound_the_memory_held(pg_conn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    big = 100_000
    _huge_transaction(cur, big)
    upto = _lsn(cur)

    def peak(**kwargs: object) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            window = peek_window(pg_conn, "s", "pub", upto, **kwargs)  # type: ignore[arg-type]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert window.change_count == big + 3
        return peak

    peek_window(pg_conn, "s", "pub", upto)  # warm-up: caches (e.g. shared ordinals) filled
    whole = peak()
    collect = Collector(keep=False)
    portioned = peak(portion_changes=PORTION // 4, on_portion=collect)
    assert sum(collect.sizes) > big - PORTION // 4
    # 5,000 rows held at most instead of ~100,000: far below a quarter of the whole.
    print(f"tracemalloc peak: whole {whole:,} B, in portions {portioned:,} B")
    assert portioned < whole / 4, (portioned, whole)


def test_streamed_transactions_replay_in_portions(pg_conn, pg_dsn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    cur.execute("BEGIN")
    cur.execute("INSERT INTO a SELECT g, repeat('x', 50), g FROM generate_series(1, 12000) g")
    cur.execute("SAVEPOINT s1")
    cur.execute("INSERT INTO b SELECT g, 'gone' FROM generate_series(1, 3000) g")
    cur.execute("ROLLBACK TO SAVEPOINT s1")  # an aborted subtransaction: never handed out
    cur.execute("INSERT INTO b SELECT g, 'kept' FROM generate_series(1, 3000) g")
    cur.execute("UPDATE a SET n = -n WHERE id <= 4000")
    cur.execute("COMMIT")
    # A big transaction still open at the window's end: streamed, never committed here.
    other = psycopg2.connect(pg_dsn)
    try:
        ocur = other.cursor()
        ocur.execute("INSERT INTO a SELECT g, 'open', 0 FROM generate_series(100001, 110000) g")
        cur.execute("INSERT INTO b VALUES (-2, 'late')")  # flushes the open one's WAL too
        upto = _lsn(cur)
        options = {"streaming": True, "decoding_work_mem": "64kB",
                   "spill_limit_bytes": 256 * 1024}
        whole = peek_window(pg_conn, "s", "pub", upto, **options)  # type: ignore[arg-type]
        collect = Collector()
        final = peek_window(pg_conn, "s", "pub", upto, portion_changes=3000,
                            on_portion=collect, **options)  # type: ignore[arg-type]
    finally:
        other.rollback()
        other.close()
    assert whole.change_count == 12000 + 3000 + 4000 + 1
    assert collect.sizes == [3000] * 6
    merged = merge_portions(collect.portions, final)
    assert columns(merged) == columns(whole)
    assert final.transactions == whole.transactions and len(whole.transactions) == 2
    values = {row[1] for p in [*collect.portions, final] for seg in p.segments()
              for row in seg.after if row is not None}
    assert b"gone" not in values and b"open" not in values and b"kept" in values
    cur.execute("SET logical_decoding_work_mem = '64kB'")
    cur.execute("SELECT count(DISTINCT substr(data, 2, 4)) FROM "
                "pg_logical_slot_peek_binary_changes('s', %s, NULL, 'proto_version', '2', "
                "'publication_names', 'pub', 'streaming', 'on') "
                "WHERE get_byte(data, 0) = ascii('S')", (str(upto),))
    assert cur.fetchone()[0] == 2  # both big transactions really were streamed


def test_portion_arguments_go_together(pg_conn) -> None:
    cur = pg_conn.cursor()
    _setup(cur)
    upto = _lsn(cur)
    with pytest.raises(ValueError):
        peek_window(pg_conn, "s", "pub", upto, portion_changes=10)
    with pytest.raises(ValueError):
        peek_window(pg_conn, "s", "pub", upto, on_portion=Collector())
    with pytest.raises(ValueError):
        peek_window(pg_conn, "s", "pub", upto, portion_changes=0, on_portion=Collector())
