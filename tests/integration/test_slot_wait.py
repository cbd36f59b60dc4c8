"""An initial snapshot while a transaction is open at the source: slot creation waits for it
(PostgreSQL's rule), and meanwhile the run logs, every few seconds, the backends it waits
for: pid, application, transaction age, state and query. Once the transaction commits the
snapshot goes on, and its row arrives by the stream: the next run is exact."""

from __future__ import annotations

import threading
import time

import psycopg2
import pytest

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_open_transaction_during_slot_creation_is_named(pg_dsn, pg_conn, spark,
                                                        lakehouse) -> None:
    progress: list[str] = []  # the run's log (a Dagster run: context.log)
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE w (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO w SELECT g, 'v' FROM generate_series(1, 50) g")
    blocker = psycopg2.connect(pg_dsn, application_name="forgotten psql")
    try:
        with blocker.cursor() as cur:  # a transaction ID assigned, left open
            cur.execute("INSERT INTO w VALUES (999, 'open while the slot was created')")
        blocker_pid = blocker.info.backend_pid

        def reported() -> list[str]:
            return [m for m in list(progress) if m.startswith("creating replication slot")]

        def release() -> None:
            deadline = time.monotonic() + 120
            while not reported() and time.monotonic() < deadline:
                time.sleep(0.1)
            blocker.commit()

        releaser = threading.Thread(target=release, daemon=True)
        releaser.start()
        settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse),
                                   include=("public\\.w",), slot="waits", publication="waits")
        run_bronze(settings, spark, force_snapshot_step=True, progress=progress.append)
        releaser.join()
    finally:
        blocker.rollback()
        blocker.close()
    (message, *_) = reported()
    assert "creating replication slot 'waits' has waited" in message
    assert f"pid {blocker_pid} (application 'forgotten psql', transaction open for" in message
    assert "idle in transaction" in message
    assert "INSERT INTO w VALUES (999" in message
    assert f"pg_terminate_backend(pid) for pid {blocker_pid}" in message

    with pg_conn.cursor() as cur:
        cur.execute("UPDATE w SET v = 'after' WHERE id <= 5")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    uri = table_uri(str(lakehouse), "silver", "public", "w")
    assert assert_silver_equals_source(pg_conn, uri, "public", "w", ["id"]) == 51
