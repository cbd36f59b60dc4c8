"""A bronze backlog far above one silver batch catches up in batches, each committed as it
goes: the run is killed after its first batch's commit, silver then records a bronze
version between where it was and bronze's end, and the next run resumes from there and
converges (silver equals the source): at most two runs.

The backlog (inserts of new keys, updates, deletes in many windows, and one transaction of
1,500 updates alone in its window, split across batches by its files) is about 20 times the
batch budget of 300 rows.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.faults import ENV
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.lake.delta import committed_version
from pgcdc_dagster.lake.silver import live_rows
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
BATCH = 300


def test_backlog_catches_up_in_committed_batches(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE b (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO b SELECT g, 'v' FROM generate_series(1, 2000) g")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                               slot="backlog", publication="backlog", window_max_bytes=1 << 20,
                               window_portion_changes=250, silver_batch_rows=BATCH)
    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)
    with pg_conn.cursor() as cur:
        for start in range(2001, 4001, 250):  # one window each (see below)
            cur.execute(f"INSERT INTO b SELECT g, 'new' FROM generate_series({start}, "
                        f"{start + 249}) g")
            cur.execute(f"UPDATE b SET v = 'u' || {start} WHERE id BETWEEN {start - 2000} "
                        f"AND {start - 1800}")
            cur.execute(f"DELETE FROM b WHERE id BETWEEN {start - 1790} AND {start - 1750}")
        cur.execute("UPDATE b SET v = 'big' WHERE id BETWEEN 2001 AND 3500")
    # small windows: many bronze versions
    run_bronze(dataclasses.replace(settings, window_max_bytes=96 << 10), spark,
               force_snapshot_step=False)
    (ctx,) = load_contexts(settings)
    silver_uri = ctx.silver_uri
    bronze = DeltaTable(ctx.bronze_uri)
    before = committed_version(DeltaTable(silver_uri), ctx.silver_app_id)
    assert before is not None and bronze.version() - before >= 5

    env = dict(os.environ, **{ENV: "after_silver_batch", "PYSPARK_PYTHON": sys.executable})
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.crash_runner", pg_dsn, str(lakehouse), "backlog",
         "arrow-silver", f"silver-batch-rows={BATCH}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    reached = committed_version(DeltaTable(silver_uri), ctx.silver_app_id)
    assert before < reached < bronze.version()  # the first batch was committed

    run_silver(settings, spark)
    assert committed_version(DeltaTable(silver_uri), ctx.silver_app_id) == bronze.version()
    assert assert_silver_equals_source(pg_conn, silver_uri, "public", "b", ["id"]) == \
        live_rows(silver_uri).num_rows

