"""Window bounds: a cap on changes per window ends the window at its last
whole transaction, so nothing is skipped even though PostgreSQL stopped early."""

from __future__ import annotations

import time

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import internal_uri, table_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_change_cap_splits_windows_without_loss(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE w (id int PRIMARY KEY, v int)")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.w",),
                               slot="caps", publication="caps", window_max_changes=50)
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        for i in range(20):  # 20 transactions of 7 changes, with messages in between
            cur.execute("BEGIN")
            cur.execute("INSERT INTO w SELECT g, 0 FROM generate_series(%s, %s) g",
                        (i * 7, i * 7 + 6))
            cur.execute("COMMIT")
            cur.execute("SELECT pg_logical_emit_message(false, 'app', %s)", (str(i),))
        # A run reads up to the WAL flushed when it starts; the last, non-transactional
        # message forces no flush (the WAL writer flushes it within wal_writer_delay).
        cur.execute("SELECT pg_current_wal_insert_lsn()")
        written = cur.fetchone()[0]
        for _ in range(200):
            cur.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (written,))
            if cur.fetchone()[0]:
                break
            time.sleep(0.05)
    report = run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    # 20 x (BEGIN, RELATION or not, 7 changes, COMMIT, message) ~ 200 slot rows at most 50
    # per window: PostgreSQL ends a window at the record that reaches the cap -> 4 windows
    # (the run reads up to the WAL flushed when it started, so no trailing empty window).
    assert report.stream is not None and len(report.stream.windows) >= 4
    assert all(w.changes <= 50 for w in report.stream.windows)
    bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "w")).to_pyarrow_table()
    assert bronze.num_rows == 140
    assert pc.count_distinct(pc.struct_field(bronze["key"], "id")).as_py() == 140
    msgs = DeltaTable(internal_uri(str(lakehouse), "messages")) \
        .to_pyarrow_table()
    assert sorted(int(m) for m in pc.cast(pc.struct_field(msgs["message"], "content"),
                                          "string").to_pylist()) == list(range(20))
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "w"),
                                "public", "w", ["id"])
