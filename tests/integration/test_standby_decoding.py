"""Capture from a hot standby (``PGCDC_PG_DSN`` pointing at it): logical decoding on a standby
came with PostgreSQL 16. On 16+ the initial snapshot (slot with an exported snapshot, created
on the standby) and the stream (peeks and slot advances on the standby) run against the
standby while the writes go to the primary, and silver equals the source. The publication
is made on the primary (a standby is read-only: ``publication.autocreate.mode = disabled``);
the standby runs ``hot_standby_feedback`` over a physical slot so that the primary keeps the
catalog rows its logical slot needs. On 14 and 15 the run refuses, naming the fix.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import psycopg2
import pytest

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.postgres.local_cluster import LocalCluster
from tests.support.compare import assert_silver_equals_source
from tests.support.ha import query, session_pg_major, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MAJOR = session_pg_major()


@pytest.fixture
def standby_pair() -> Iterator[tuple[LocalCluster, LocalCluster]]:
    root = Path(tempfile.mkdtemp(prefix="pgcdc-test-sb-"))
    primary = LocalCluster(root / "primary", major=MAJOR)
    standby: LocalCluster | None = None
    try:
        primary.start()
        query(primary.dsn, "CREATE TABLE sd (id int PRIMARY KEY, n int, v text)")
        query(primary.dsn, "INSERT INTO sd SELECT g, 0, 'v' || g FROM generate_series(1, 500) g")
        query(primary.dsn, "CREATE PUBLICATION sd FOR TABLE sd")
        standby = primary.standby(root / "standby", slot="sb1").start()
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()
        shutil.rmtree(root, ignore_errors=True)


def _caught_up(primary: LocalCluster, standby: LocalCluster) -> None:
    [(target,)] = query(primary.dsn, "SELECT pg_current_wal_lsn()::text")
    wait_for("the standby's replay", lambda: query(
        standby.dsn, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))[0][0])


class _StandbySnapshots(threading.Thread):
    """Logs a running-transactions record on the primary twice a second: a slot created on a
    standby waits for one (the primary's bgwriter writes one every 15 s when it is busy)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            query(self.dsn, "SELECT pg_log_standby_snapshot()")


def test_snapshot_and_stream_from_a_standby(standby_pair, spark, lakehouse) -> None:
    primary, standby = standby_pair
    _caught_up(primary, standby)
    settings = CaptureSettings(dsn=standby.dsn, lakehouse=str(lakehouse), include=("public\\.sd",),
                               slot="sd_cdc", publication="sd",
                               publication_autocreate="disabled")
    if MAJOR < 16:
        with pytest.raises(ConfigurationError, match="standby needs PostgreSQL 16"):
            run_bronze(settings, spark, force_snapshot_step=True)
        return
    kicker = _StandbySnapshots(primary.dsn)
    kicker.start()
    try:
        snap = run_bronze(settings, spark, force_snapshot_step=True)
    finally:
        kicker.done.set()
        kicker.join()
    assert snap.snapshot is not None and snap.snapshot.slot_action == "create"
    assert query(standby.dsn, "SELECT count(*) FROM pg_replication_slots "
                              "WHERE slot_name = 'sd_cdc'")[0][0] == 1
    assert query(primary.dsn, "SELECT count(*) FROM pg_replication_slots "
                              "WHERE slot_name = 'sd_cdc'")[0][0] == 0
    query(primary.dsn, "UPDATE sd SET n = n + 1 WHERE id <= 100")
    query(primary.dsn, "INSERT INTO sd SELECT g, 7, 'new' FROM generate_series(501, 600) g")
    query(primary.dsn, "DELETE FROM sd WHERE id > 450 AND id <= 500")
    _caught_up(primary, standby)
    run = run_bronze(settings, spark, force_snapshot_step=False)
    assert run.stream is not None and sum(w.changes for w in run.stream.windows) >= 250
    run_silver(settings, spark)
    with closing(psycopg2.connect(primary.dsn)) as conn:
        rows = assert_silver_equals_source(
            conn, table_uri(str(lakehouse), "silver", "public", "sd"), "public", "sd", ["id"])
    assert rows == 550
