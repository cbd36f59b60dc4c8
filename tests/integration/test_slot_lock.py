"""The slot's lock: every reader of the slot is refused while another session holds it, and a
bronze commit refuses a window another writer committed first."""

from __future__ import annotations

import threading

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.bronze_write import BronzeWindowWriter
from pgcdc_dagster.capture.incremental import run_incremental
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.capture.stream import _ConverterCache
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.exceptions import SlotInUseError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.consistency import compare_with_source
from pgcdc_dagster.ops.teardown import teardown
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.peek import peek_window
from pgcdc_dagster.postgres.slot import current_flush_lsn, slot_info
from pgcdc_dagster.postgres.slot_lock import (
    LOCK_CLASS,
    SlotLease,
    acquire,
    current_lease,
    lock_key,
    slot_lock_holder,
)
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SLOT = "lockx"


def _held_elsewhere(dsn: str, run_id: str) -> SlotLease:
    """The slot's lock taken by another thread (another reader, as another process would)."""
    out: list[SlotLease | BaseException] = []

    def take() -> None:
        try:
            out.append(acquire(dsn, SLOT, run_id))
        except SlotInUseError as exc:
            out.append(exc)

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _refused(call, run_id: str) -> None:
    with pytest.raises(SlotInUseError) as err:
        call()
    message = str(err.value)
    assert f"replication slot {SLOT!r} is in use: another reader holds its lock" in message
    assert f"Dagster run {run_id}" in message and "pg_terminate_backend" in message


def _bronze_versions(lakehouse) -> int:
    return DeltaTable(table_uri(str(lakehouse), "bronze", "public", "t")).version()


def _no_duplicates(lakehouse) -> int:
    data = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "t")).to_pyarrow_table(
        columns=["op", "__commit_lsn", "__ordinal"])
    data = data.filter(pc.not_equal(data["op"], "r"))
    assert data.num_rows == data.group_by(["__commit_lsn", "__ordinal"]).aggregate([]).num_rows
    return data.num_rows


def test_every_slot_reader_waits_for_the_lock(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 500) g")
        cur.execute("SELECT pg_try_advisory_lock(%s::bigint)", (lock_key(SLOT),))
        assert cur.fetchone()[0]  # another application's bigint lock never collides
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.t",),
                               slot=SLOT, publication=SLOT)

    # Initial snapshot against a held lock: refused before the slot or bronze exist.
    other = _held_elsewhere(pg_dsn, "run-a")
    holder = slot_lock_holder(pg_dsn, SLOT)
    assert holder is not None and holder.pid == other.pid and holder.run_id == "run-a"
    _refused(lambda: run_bronze(settings, spark, force_snapshot_step=True), "run-a")
    with pg_conn.cursor() as cur:
        assert slot_info(pg_conn, SLOT) is None
        cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND classid = %s::bigint::oid", (LOCK_CLASS,))
        assert cur.fetchone()[0] == 1  # the refused reader left nothing held
    other.release()
    assert slot_lock_holder(pg_dsn, SLOT) is None

    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE t SET v = v || '!' WHERE id <= 200")
        cur.execute("INSERT INTO t SELECT g, 'n' FROM generate_series(501, 700) g")

    # Micro-batch, incremental snapshot, teardown and the silver check: all refused.
    other = _held_elsewhere(pg_dsn, "run-b")
    version = _bronze_versions(lakehouse)
    _refused(lambda: run_bronze(settings, spark, force_snapshot_step=False), "run-b")
    _refused(lambda: run_incremental(settings), "run-b")
    _refused(lambda: teardown(pg_dsn, SLOT, SLOT, SLOT), "run-b")
    [ctx] = load_contexts(settings)
    report = compare_with_source(pg_dsn, ctx, SLOT, SLOT)
    assert report.reason is not None and "Dagster run run-b" in report.reason
    assert _bronze_versions(lakehouse) == version
    assert slot_info(pg_conn, SLOT) is not None
    other.release()

    # Re-entrant within a thread (a Dagster run holds it from its first step to its end);
    # another thread is another reader.
    lease = acquire(pg_dsn, SLOT, "run-c")
    try:
        run_bronze(settings, spark, force_snapshot_step=False)
        assert current_lease(pg_dsn, SLOT) is lease and lease.held
        with pytest.raises(SlotInUseError, match="Dagster run run-c"):
            _held_elsewhere(pg_dsn, "run-d")
    finally:
        lease.release()
    run_silver(settings, spark)
    assert _no_duplicates(lakehouse) == 400
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "t"),
                                "public", "t", ["id"])


def test_bronze_commit_refuses_a_window_another_writer_committed(pg_dsn, pg_conn, spark,
                                                                  lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.t",),
                               slot=SLOT, publication=SLOT)
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 300) g")
        cur.execute("DELETE FROM t WHERE id <= 50")
    contexts = {c.relation.qualified: c for c in load_contexts(settings)}
    cache = _ConverterCache(pg_dsn, settings)
    ident = SourceIdentity("pgcdc", "db")
    with connection(pg_dsn) as conn:
        start = slot_info(conn, SLOT).confirmed_flush_lsn
        upto = current_flush_lsn(conn)
        window = peek_window(conn, SLOT, SLOT, upto)
    # Two writers read the same window (two readers of one slot, the lock bypassed).
    first, second = (BronzeWindowWriter(contexts, cache.get, ident, str(lakehouse),
                                        settings.app_prefix) for _ in range(2))
    try:
        first.add(window)
        second.add(window)
        first.commit(upto, start)
        version = _bronze_versions(lakehouse)
        with pytest.raises(SlotInUseError, match=r"bronze of public\.t: another writer "
                           r"committed up to .* would duplicate its events"):
            second.commit(upto, start)
        assert _bronze_versions(lakehouse) == version
    finally:
        for writer in (first, second):
            writer.close()
        cache.close()
    assert _no_duplicates(lakehouse) == 350
    run_bronze(settings, spark, force_snapshot_step=False)  # the slot was not advanced
    run_silver(settings, spark)
    assert _no_duplicates(lakehouse) == 350
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "t"),
                                "public", "t", ["id"])
