"""The connection to the source lost while a micro-batch reads the slot: the backend
terminated with ``pg_terminate_backend``, and the server stopped in immediate mode (a crash,
or ``pg_ctl restart -m immediate``) then started again.

Each fault gets :class:`SourceConnectionLostError` naming the cause and saying that the next
run resumes by itself (not libpq's ``error with status PGRES_COPY_OUT and no message``), and
the next run makes bronze and silver exact: every change exactly once.

The fault is injected while the peek runs: a thread watches ``pg_stat_activity`` for the
session running ``pg_logical_slot_peek_binary_changes`` and acts on it. The window carries
one transaction of 40,000 rows, which PostgreSQL decodes and sends for far longer than the
watcher takes to see it.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.exceptions import SourceConnectionLostError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.postgres.local_cluster import LocalCluster
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PEEK = "%pg_logical_slot_peek_binary_changes%"
ROWS = 40_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="pgcdc-faults-"))
    own = LocalCluster(root / "pg").start()
    try:
        yield own
    finally:
        own.stop()
        shutil.rmtree(root, ignore_errors=True)


def _database(cluster: LocalCluster, name: str) -> str:
    admin = psycopg2.connect(cluster.dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    admin.close()
    return cluster.dsn.replace("dbname=postgres", f"dbname={name}")


def _postmaster(cluster: LocalCluster) -> int:
    return int((cluster.data_dir / "postmaster.pid").read_text().splitlines()[0])


def _when_peeking(dsn: str, act) -> threading.Thread:
    """Call ``act(pid)`` with the backend of the first peek seen running."""

    def watch() -> None:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        try:
            while True:
                with conn.cursor() as cur:
                    cur.execute("SELECT pid FROM pg_stat_activity WHERE state = 'active' "
                                "AND query LIKE %s AND pid <> pg_backend_pid()", (PEEK,))
                    row = cur.fetchone()
                if row is not None:
                    act(row[0], conn)
                    return
                time.sleep(0.002)
        finally:
            conn.close()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("fault", ["terminate", "immediate_restart"])
def test_connection_lost_while_reading_the_slot(cluster, spark, lakehouse, fault) -> None:
    dsn = _database(cluster, f"lost_{fault}")
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 100) g")
    settings = CaptureSettings(dsn=dsn, lakehouse=str(lakehouse), include=("public\\.t",),
                               slot=f"lost_{fault}", publication="lost")
    run_bronze(settings, spark, force_snapshot_step=True)
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO t SELECT g, repeat('x', 50) FROM generate_series(101, {ROWS}) g")
        cur.execute("UPDATE t SET v = 'changed' WHERE id <= 10")
    conn.close()

    def terminate(pid: int, watcher) -> None:
        with watcher.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def crash(pid: int, watcher) -> None:
        postmaster = _postmaster(cluster)
        os.kill(postmaster, signal.SIGQUIT)  # immediate shutdown: no checkpoint
        while cluster.running():
            time.sleep(0.05)

    watcher = _when_peeking(dsn, terminate if fault == "terminate" else crash)
    with pytest.raises(SourceConnectionLostError) as err:
        run_bronze(settings, spark, force_snapshot_step=False)
    watcher.join()
    message = str(err.value)
    assert "PGRES_COPY_OUT" not in message.split(":")[0]
    assert "lost the connection to the source PostgreSQL" in message
    assert f"while reading replication slot 'lost_{fault}'" in message
    assert "nothing is lost: the next run resumes from" in message
    if fault == "terminate":
        assert "pg_terminate_backend" in message and "accepts connections again" in message
    else:
        cluster.start()

    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    check = psycopg2.connect(dsn)
    try:
        assert assert_silver_equals_source(check, table_uri(str(lakehouse), "silver", "public",
                                                            "t"), "public", "t", ["id"]) == ROWS
    finally:
        check.close()
    bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "t"))
    counts = {c["values"]: c["counts"] for c in
              pc.value_counts(bronze.to_pyarrow_table(columns=["op"])["op"]).to_pylist()}
    assert counts == {"r": 100, "c": ROWS - 100, "u": 10}
