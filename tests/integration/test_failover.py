"""Capture across a failover of the source: a primary, a physical standby (``pg_basebackup``),
a writer that keeps writing through the promotion, and the capture pointed at the new primary
by its DSN only.

* PostgreSQL 17+: the slot is a failover slot (``slot.failover``, on by default), the standby
  synchronizes it (``sync_replication_slots``) and the primary decodes nothing its standby has
  not confirmed (``synchronized_standby_slots``). The primary is crashed (immediate stop) while
  the writer runs; after the promotion the capture continues from the synchronized slot:
  every row of the new primary has exactly one create event in bronze, every increment of
  ``n`` exactly one update event (nothing lost, nothing doubled even when the synchronized slot
  lagged and windows were read again), no event of a row the new primary does not have, and
  silver equals the new primary.
* PostgreSQL 14-16 (no failover slots): the promoted standby has no slot. The next run refuses
  (``snapshot.mode = initial``) naming the fix; with ``when_needed`` it creates a new slot,
  snapshots again, and silver equals the new primary.

Each test runs the major version of the session (``PGCDC_TEST_PG_VERSION``): the matrix
(``scripts/test_matrix.sh``) runs the first on 17 and 18, the second on 14-16.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import psycopg2
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.exceptions import SlotLostError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.postgres.local_cluster import LocalCluster
from tests.support.compare import assert_silver_equals_source
from tests.support.ha import FailoverWriter, query, session_pg_major, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MAJOR = session_pg_major()
SLOT = "ha_cdc"


@pytest.fixture
def ha_pair() -> Iterator[tuple[LocalCluster, LocalCluster]]:
    """A primary and its streaming standby (physical slot ``sb1``; on 17+ the standby
    synchronizes failover slots and the primary waits for it before decoding). Not under
    ``tmp_path``: pytest makes its root private to root again whenever a session starts, and
    the clusters run as the postgres user."""
    failover = MAJOR >= 17
    tmp_path = Path(tempfile.mkdtemp(prefix="pgcdc-test-ha-"))
    primary = LocalCluster(tmp_path / "primary", major=MAJOR, overrides=(
        {"synchronized_standby_slots": "'sb1'"} if failover else {}))
    standby: LocalCluster | None = None
    try:
        primary.start()
        query(primary.dsn, "CREATE TABLE ha (id int PRIMARY KEY, n int NOT NULL, v text)")
        standby = primary.standby(tmp_path / "standby", slot="sb1", overrides=(
            {"sync_replication_slots": "on"} if failover else {})).start()
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()
        shutil.rmtree(tmp_path, ignore_errors=True)


def _settings(dsn: str, lakehouse: Path, mode: str = "initial") -> CaptureSettings:
    return CaptureSettings(dsn=dsn, lakehouse=str(lakehouse), include=("public\\.ha",),
                           slot=SLOT, publication=SLOT, snapshot_mode=mode)


def _slot_row(dsn: str) -> tuple[object, ...] | None:
    cols = "failover, synced, confirmed_flush_lsn::text" if MAJOR >= 17 else \
        "false, false, confirmed_flush_lsn::text"
    rows = query(dsn, f"SELECT {cols} FROM pg_replication_slots WHERE slot_name = %s",
                 (SLOT,))
    return rows[0] if rows else None


def _bronze_counts(lakehouse: Path) -> tuple[Counter[int], Counter[int], set[int]]:
    """Create events per id, update events per id, ids of any event."""
    rows = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "ha")).to_pyarrow_table(
        columns=["op", "before", "after"]).to_pylist()
    creates: Counter[int] = Counter()
    updates: Counter[int] = Counter()
    seen: set[int] = set()
    for e in rows:
        image = e["after"] or e["before"]
        key = int(image["id"])
        seen.add(key)
        if e["op"] in ("c", "r"):
            creates[key] += 1
        elif e["op"] == "u":
            updates[key] += 1
    return creates, updates, seen


@pytest.mark.skipif(MAJOR < 17, reason=f"PostgreSQL {MAJOR} has no failover slots (17+); "
                    "test_promoted_standby_without_failover_slot_refuses_then_resnapshots "
                    "covers it")
def test_failover_slot_survives_promotion_with_nothing_lost_or_doubled(
        ha_pair, spark, lakehouse) -> None:
    primary, standby = ha_pair
    settings = _settings(primary.dsn, lakehouse)
    run_bronze(settings, spark, force_snapshot_step=True)
    assert _slot_row(primary.dsn)[:2] == (True, False)  # a failover slot (slot.failover)
    writer = FailoverWriter(primary.dsn)
    writer.start()
    try:
        writer.wait_rows(300)

        def synchronized() -> bool:
            # The standby keeps its copy only once the slot's catalog xmin and restart point
            # passed its own: after a micro-batch advanced it past a running-transactions
            # record (a checkpoint writes one).
            query(primary.dsn, "CHECKPOINT")
            run_bronze(settings, spark, force_snapshot_step=False)
            confirmed = _slot_row(primary.dsn)[2]
            row = _slot_row(standby.dsn)
            return row is not None and row[1] is True and row[2] is not None and query(
                standby.dsn, "SELECT %s::pg_lsn <= %s::pg_lsn", (confirmed, row[2]))[0][0]

        wait_for("the standby to synchronize the slot", synchronized, timeout=120, interval=1.0)
        writer.wait_rows(300)
        run_bronze(settings, spark, force_snapshot_step=False)  # the synced copy may lag it
        writer.wait_rows(100)
        primary.stop(immediate=True)  # a crash while the writer writes
        standby.promote()
        writer.target = standby.dsn
        writer.wait_rows(300)
        moved = dataclasses.replace(settings, dsn=standby.dsn)  # the DSN is all that changes
        run_bronze(moved, spark, force_snapshot_step=False)
    finally:
        writer.stop()
    report = run_bronze(moved, spark, force_snapshot_step=False)
    assert report.snapshot is None or not report.snapshot.performed  # no re-snapshot
    run_silver(moved, spark)

    source = {int(i): int(n) for i, n in query(standby.dsn, "SELECT id, n FROM ha")}
    assert len(source) > 900 and writer.errors > 0  # the writer did go through the failover
    creates, updates, seen = _bronze_counts(lakehouse)
    assert seen == set(source), "bronze has events of rows the new primary lacks, or misses"
    assert set(creates.values()) == {1}, "a row created twice (or never) in bronze"
    assert {k: updates[k] for k in source} == source, "an update lost or doubled in bronze"
    with closing(psycopg2.connect(standby.dsn)) as conn:
        rows = assert_silver_equals_source(
            conn, table_uri(str(lakehouse), "silver", "public", "ha"), "public", "ha", ["id"])
    assert rows == len(source)


@pytest.mark.skipif(MAJOR >= 17, reason=f"PostgreSQL {MAJOR} has failover slots: "
                    "test_failover_slot_survives_promotion_with_nothing_lost_or_doubled "
                    "covers it")
def test_promoted_standby_without_failover_slot_refuses_then_resnapshots(
        ha_pair, spark, lakehouse) -> None:
    primary, standby = ha_pair
    settings = _settings(primary.dsn, lakehouse)
    run_bronze(settings, spark, force_snapshot_step=True)
    writer = FailoverWriter(primary.dsn)
    writer.start()
    try:
        writer.wait_rows(200)
        run_bronze(settings, spark, force_snapshot_step=False)
        writer.wait_rows(100)
        primary.stop(immediate=True)
        standby.promote()
        writer.target = standby.dsn
        writer.wait_rows(200)
    finally:
        writer.stop()
    assert _slot_row(standby.dsn) is None  # slots are not replicated before 17
    moved = dataclasses.replace(settings, dsn=standby.dsn)
    with pytest.raises(SlotLostError, match=r"does not exist.*snapshot\.mode = when_needed"):
        run_bronze(moved, spark, force_snapshot_step=False)
    assert _slot_row(standby.dsn) is None  # the refusal created nothing

    again = dataclasses.replace(moved, snapshot_mode="when_needed")
    report = run_bronze(again, spark, force_snapshot_step=False)
    assert report.snapshot is not None and report.snapshot.slot_action == "create"
    query(standby.dsn, "UPDATE ha SET n = n + 10 WHERE id <= 50")  # streamed after it
    run_bronze(again, spark, force_snapshot_step=False)
    run_silver(again, spark)
    with closing(psycopg2.connect(standby.dsn)) as conn:
        rows = assert_silver_equals_source(
            conn, table_uri(str(lakehouse), "silver", "public", "ha"), "public", "ha", ["id"])
    assert rows == query(standby.dsn, "SELECT count(*) FROM ha")[0][0] > 300
