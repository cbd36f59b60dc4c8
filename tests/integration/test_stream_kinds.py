"""Every kind of change through the stream: messages (STR-61, EVT-25),
transaction metadata (STR-69, EVT-14), skipped.operations, tombstones.on.delete, TRUNCATE
(STR-53), REPLICA IDENTITY FULL before images (STR-3x), heartbeats (STR-4x)."""

from __future__ import annotations

import dataclasses

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import internal_uri, table_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _settings(pg_dsn, lakehouse, **kw) -> CaptureSettings:
    return CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                           slot="kinds", publication="kinds", **kw)


def _bronze(lakehouse, schema: str, table: str):
    uri = internal_uri(str(lakehouse), table) if schema == "_pgcdc" \
        else table_uri(str(lakehouse), "bronze", schema, table)
    return DeltaTable(uri).to_pyarrow_table()


def test_messages_transactions_tombstones_truncate(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        cur.execute("CREATE TABLE full_t (id int PRIMARY KEY, v text, n int)")
        cur.execute("ALTER TABLE full_t REPLICA IDENTITY FULL")
        cur.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        cur.execute("INSERT INTO full_t VALUES (1, 'x', 10)")
    settings = _settings(pg_dsn, lakehouse, tombstones_on_delete=True,
                         provide_transaction_metadata=True, heartbeat_interval_ms=1000,
                         heartbeat_action_query="CREATE TABLE IF NOT EXISTS hb_seen "
                                                "(x int PRIMARY KEY)")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO t VALUES (3, 'c')")
        cur.execute("SELECT pg_logical_emit_message(true, 'app.audit', 'in-txn')")
        cur.execute("UPDATE full_t SET n = 11")
        cur.execute("COMMIT")
        cur.execute("SELECT pg_logical_emit_message(false, 'app.audit', '\\x00ff'::bytea)")
        cur.execute("SELECT pg_logical_emit_message(false, 'pgcdc.internal', 'ignored')")
        cur.execute("DELETE FROM t WHERE id = 1")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)

    t = _bronze(lakehouse, "public", "t")
    ops = t.column("op").to_pylist()
    assert ops.count("r") == 2 and ops.count("c") == 1 and ops.count("d") == 1
    assert ops.count(None) == 1  # the tombstone after the delete
    tomb = t.filter(pc.is_null(t["op"])).to_pylist()[0]
    assert tomb["key"] == {"id": 1} and tomb["before"] is None and tomb["after"] is None

    full_all = _bronze(lakehouse, "public", "full_t")
    full = full_all.filter(pc.equal(full_all["op"], "u")).to_pylist()
    assert full, full_all.column("op").to_pylist()
    assert full[0]["before"] == {"id": 1, "v": "x", "n": 10}
    assert full[0]["after"] == {"id": 1, "v": "x", "n": 11}

    msgs = _bronze(lakehouse, "_pgcdc", "messages").to_pylist()
    assert sorted((m["message"]["prefix"], m["message"]["content"], m["transactional"])
                  for m in msgs) == [("app.audit", b"\x00\xff", False),
                                     ("app.audit", b"in-txn", True)]
    assert all(m["op"] == "m" and m["source"]["table"] == "" for m in msgs)
    in_txn = next(m for m in msgs if m["transactional"])
    assert in_txn["source"]["txId"] is not None
    assert next(m for m in msgs if not m["transactional"])["source"]["txId"] is None

    txs = _bronze(lakehouse, "_pgcdc", "transactions").to_pylist()
    ends = [x for x in txs if x["status"] == "END"]
    assert len([x for x in txs if x["status"] == "BEGIN"]) == len(ends) >= 2
    big = next(x for x in ends if x["event_count"] == 3)
    assert sorted((d["data_collection"], d["event_count"]) for d in big["data_collections"]) \
        == [("public.full_t", 1), ("public.t", 1)]
    event = t.filter(pc.equal(t["op"], "c")).to_pylist()[0]
    assert event["transaction"]["id"] == big["id"]
    with pg_conn.cursor() as cur:
        cur.execute("SELECT to_regclass('hb_seen') IS NOT NULL")
        assert cur.fetchone()[0]

    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "t"),
                                "public", "t", ["id"])
    with pg_conn.cursor() as cur:
        cur.execute("TRUNCATE t")
        cur.execute("INSERT INTO t VALUES (9, 'after truncate')")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    assert "t" in _bronze(lakehouse, "public", "t").column("op").to_pylist()
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "t"),
                                "public", "t", ["id"])


def test_skipped_operations(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO t VALUES (1, 'a')")
    settings = _settings(pg_dsn, lakehouse, skipped_operations="u,t")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE t SET v = 'b'")
        cur.execute("INSERT INTO t VALUES (2, 'c')")
        cur.execute("TRUNCATE t")
    run_bronze(settings, spark, force_snapshot_step=False)
    ops = sorted(_bronze(lakehouse, "public", "t").column("op").to_pylist())
    assert ops == ["c", "r"]
    with pytest.raises(Exception, match=r"skipped\.operations"):
        run_bronze(dataclasses.replace(settings, skipped_operations="x"), spark,
                   force_snapshot_step=False)
