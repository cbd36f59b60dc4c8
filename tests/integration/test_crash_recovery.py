"""Crash tests (FT- items, STR-18): the run is killed (SIGKILL) after decode, between
two tables' bronze commits, after the bronze commit before the slot advance, after the
advance, and after a silver merge; the next run loses nothing and doubles nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.faults import ENV
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source
from tests.support.workload import SCHEMA, Workload

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
TABLES = (("accounts", ["id"]), ("events", ["id"]), ("Mixed Case", ["Key", "part"]))
SNAPSHOT_ROWS = {"accounts": 500, "events": 800, "Mixed Case": 300}


def _crash(dsn: str, lakehouse: Path, point: str, silver: bool = False) -> None:
    env = dict(os.environ, **{ENV: point, "PYSPARK_PYTHON": sys.executable})
    args = [sys.executable, "-m", "tests.support.crash_runner", dsn, str(lakehouse), "crash"]
    proc = subprocess.run([*args, *(["silver"] if silver else [])], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stderr[-2000:])


def _check(pg_conn, lakehouse: Path, workload: Workload) -> None:
    for table, key in TABLES:
        assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", table),
                                    "public", table, key)
        bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", table))
        counts = {c["values"]: c["counts"] for c in
                  pc.value_counts(bronze.to_pyarrow_table(columns=["op"])["op"]).to_pylist()}
        expected = {op: n for op, n in workload.expected[table].items() if n}
        assert counts == {"r": SNAPSHOT_ROWS[table], **expected}, table


@pytest.mark.parametrize("point", ["after_decode", "between_table_commits",
                                   "after_bronze_commit", "after_advance", "after_silver_merge"])
def test_killed_run_then_rerun_loses_and_doubles_nothing(point, pg_dsn, pg_conn, spark,
                                                         lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                               slot="crash", publication="crash", window_max_bytes=1 << 20)
    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)
    workload = Workload(pg_conn, seed=sum(map(ord, point)))
    workload.run(150)
    _crash(pg_dsn, lakehouse, point, silver=point == "after_silver_merge")
    workload.run(50)
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    _check(pg_conn, lakehouse, workload)
