"""Source safety (STR- slot items, FT-): a slot read by another process is a
clear, retryable outcome; a missing slot is a clear error; the slot's health is reported."""

from __future__ import annotations

import time

import pytest
from psycopg2.extras import LogicalReplicationConnection

from pgcdc_dagster.capture.runner import run_bronze
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.stream import run_windows
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.exceptions import SlotInUseError, SlotLostError
from pgcdc_dagster.postgres.connection import connect

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_slot_in_use_missing_and_health(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY)")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.t",),
                               slot="safety", publication="safety", snapshot_mode="initial")
    run = run_bronze(settings, spark, force_snapshot_step=True)
    assert run.stream is not None and run.stream.wal_status in ("reserved", "extended")

    other = connect(pg_dsn, replication=True)
    try:
        cur = other.cursor()
        assert isinstance(other, LogicalReplicationConnection)
        cur.start_replication(slot_name="safety", decode=False,
                              options={"proto_version": "1", "publication_names": "safety"})
        with pytest.raises(SlotInUseError, match=r"in use by another process.*Retry"):
            run_bronze(settings, spark, force_snapshot_step=False)
    finally:
        other.close()

    with pg_conn.cursor() as cur:
        for _ in range(100):  # the walsender of the closed connection exits asynchronously
            cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'safety'")
            if not cur.fetchone()[0]:
                break
            time.sleep(0.1)
        cur.execute("SELECT pg_drop_replication_slot('safety')")
    with pytest.raises(SlotLostError, match=r"does not exist.*initial_snapshot"):
        run_windows(settings, [], SourceIdentity("pgcdc", "db"))
