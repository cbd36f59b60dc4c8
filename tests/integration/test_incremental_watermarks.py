"""Incremental rows sit at the high watermark's position, and no user table is written
(design.md §3 decision 6; INC-03 watermarks, INC-10 emit at window close,
INC-22 ``source.snapshot = incremental``).

Independent witnesses, not the project's decoder: a ``test_decoding`` slot created before the
snapshot shows every watermark message with its LSN and xid, ``pg_walinspect`` gives the
commit record of each watermark transaction and every WAL record the run caused.
"""

from __future__ import annotations

import json
import re
import time

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.incremental import apply_signal, run_incremental
from pgcdc_dagster.cdc.dblog import WATERMARK_PREFIX, parse_signal
from pgcdc_dagster.lake.paths import table_uri
from tests.integration.test_incremental import start

pytestmark = [pytest.mark.integration, pytest.mark.spark]

USER_WRITES = """SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, n_tup_hot_upd
                 FROM pg_stat_user_tables ORDER BY relname"""


def _user_writes(cur) -> list[tuple]:  # type: ignore[no-untyped-def]
    """``pg_stat_user_tables`` write counters, once two reads a second apart agree (stats of
    backends that just ended are flushed asynchronously)."""
    last = None
    for _ in range(20):
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute(USER_WRITES)
        now = cur.fetchall()
        if now == last:
            return now
        last = now
        time.sleep(1)
    raise AssertionError("pg_stat_user_tables did not settle")


def test_rows_at_high_watermark_and_no_user_table_written(pg_dsn, pg_conn, spark,
                                                          lakehouse) -> None:
    settings = start(pg_conn, pg_dsn, lakehouse, spark)
    with pg_conn.cursor() as cur:
        cur.execute("ALTER TABLE late SET (autovacuum_enabled = false)")
        cur.execute("ALTER TABLE base SET (autovacuum_enabled = false)")
        cur.execute("CREATE EXTENSION pg_walinspect")
        cur.execute("SELECT pg_create_logical_replication_slot('probe', 'test_decoding')")
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT 1")
        before = _user_writes(cur)
        cur.execute("SELECT pg_current_wal_lsn()")
        wal_start = cur.fetchone()[0]
    apply_signal(settings, parse_signal("wm", "execute-snapshot",
                                        {"data-collections": ["public.late"]}), chunk_size=100)
    report = run_incremental(settings)
    (late,) = [t for t in report.tables if t.table == "public.late"]
    assert late.status == "done" and late.chunks_done == 3 and late.rows_emitted == 300

    with pg_conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()")
        wal_end = cur.fetchone()[0]
        # The watermarks as test_decoding sees them: message LSN and xid.
        cur.execute("SELECT (lsn - '0/0'::pg_lsn)::bigint, xid::text::bigint, data "
                    "FROM pg_logical_slot_peek_changes('probe', NULL, NULL)")
        marks = {}
        for lsn, xid, data in cur.fetchall():
            if f"prefix: {WATERMARK_PREFIX}," in data:
                assert data.startswith("message: transactional: 1 ")
                content = json.loads(data.split("content:", 1)[1])
                marks[(content["chunk"], content["kind"])] = (lsn, xid)
        # Every record the run wrote to the WAL.
        cur.execute("SELECT (start_lsn - '0/0'::pg_lsn)::bigint, xid::text::bigint, "
                    "resource_manager, record_type, coalesce(block_ref, '') "
                    "FROM pg_get_wal_records_info(%s, %s)", (wal_start, wal_end))
        records = cur.fetchall()
        cur.execute("""SELECT pg_relation_filenode(c.oid) FROM pg_class c
                       WHERE c.oid >= 16384 AND pg_relation_filenode(c.oid) IS NOT NULL""")
        user_nodes = {str(r[0]) for r in cur.fetchall()}
        cur.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        db_oid = str(cur.fetchone()[0])
        after = _user_writes(cur)

    # Four reads (the fourth came back empty), each between its own low and high watermark.
    assert sorted(marks) == [(c, k) for c in (1, 2, 3, 4) for k in ("high", "low")]
    commits = {xid: lsn for lsn, xid, rmgr, rtype, _ in records
               if rmgr == "Transaction" and rtype.startswith("COMMIT")}
    high = {c: (commits[marks[(c, "high")][1]], marks[(c, "high")][0], marks[(c, "high")][1])
            for c in (1, 2, 3)}

    # Bronze: every incremental row carries its chunk's high watermark position.
    data = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "late")).to_pyarrow_table(
        columns=["op", "source", "after", "__commit_lsn"])
    source = data["source"]
    rows = zip(data["op"].to_pylist(), pc.struct_field(source, "snapshot").to_pylist(),
               data["__commit_lsn"].to_pylist(), pc.struct_field(source, "lsn").to_pylist(),
               pc.struct_field(source, "txId").to_pylist(), data["after"].to_pylist(),
               strict=True)
    by_position: dict[tuple[int, int, int], list[int]] = {}
    for op, snap, commit, lsn, txid, after_row in rows:
        if op == "r" and snap == "incremental":
            by_position.setdefault((commit, lsn, txid), []).append(after_row["a"])
    assert set(by_position) == set(high.values())
    for chunk, position in high.items():
        keys = sorted(by_position[position])
        assert keys == list(range(100 * chunk - 99, 100 * chunk + 1)), chunk

    # No user table written: no WAL record touches a user relation, the counters are unchanged,
    # and the only messages are the eight watermarks (transactional: a commit each).
    touched = []
    for _, _, rmgr, rtype, refs in records:
        for db, node in re.findall(r"rel \d+/(\d+)/(\d+)", refs):
            if db == db_oid and node in user_nodes:
                touched.append((rmgr, rtype, refs))
    assert not touched, touched[:5]
    # ... and the same probe does see a write to a user table.
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO base VALUES (-1, -1, 'probe')")
        cur.execute("SELECT pg_relation_filenode('base'), pg_current_wal_lsn()")
        node, probe_end = cur.fetchone()
        cur.execute("SELECT coalesce(block_ref, '') FROM pg_get_wal_records_info(%s, %s) "
                    "WHERE resource_manager = 'Heap'", (wal_end, probe_end))
        refs = " ".join(r[0] for r in cur.fetchall())
    assert (db_oid, str(node)) in re.findall(r"rel \d+/(\d+)/(\d+)", refs)
    assert after == before
    messages = [r for r in records if r[2] == "LogicalMessage"]
    assert len(messages) == 8
    assert {xid for _, xid, *_ in messages} <= set(commits)
