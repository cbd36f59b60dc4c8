"""Issue 19: the lakehouse on object storage (a local S3-compatible server).

One scenario, end to end against ``s3://bucket/lakehouse``: the initial snapshot (chunk files
written by the Spark executors through pyarrow's S3 filesystem, committed by delta-rs),
micro-batches with inserts, updates, deletes and a TRUNCATE, silver prepared both in Arrow and
by Spark (files read on the executors), a run killed after its bronze commit and its rerun,
an incremental snapshot (its progress files in the bucket), and silver equal to the source.
The tables are then read straight from the bucket by delta-rs, Polars and DuckDB.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.faults import ENV
from pgcdc_dagster.capture.incremental import apply_signal, run_incremental
from pgcdc_dagster.capture.incremental_state import ProgressStore
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.dblog import parse_signal
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.storage import filesystem, storage_options
from tests.integration.test_incremental import bronze_ops  # delta-rs reads AWS_* itself
from tests.support.compare import assert_silver_equals_source
from tests.support.s3_server import SECRET_KEY
from tests.support.workload import SCHEMA, Workload

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
TABLES = (("accounts", ["id"]), ("events", ["id"]), ("Mixed Case", ["Key", "part"]))


def _crash_after_bronze_commit(dsn: str, lakehouse: str) -> None:
    env = dict(os.environ, **{ENV: "after_bronze_commit", "PYSPARK_PYTHON": sys.executable})
    proc = subprocess.run([sys.executable, "-m", "tests.support.crash_runner", dsn, lakehouse,
                           "crash"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])


def test_capture_into_object_storage(pg_dsn, pg_conn, spark, s3_server, s3_lakehouse) -> None:
    lake = s3_lakehouse
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=lake, include=("public\\..*",),
                               slot="crash", publication="crash", window_max_bytes=1 << 20)
    run = run_bronze(settings, spark, force_snapshot_step=True)
    assert run.snapshot is not None and run.snapshot.performed
    assert {t.table: t.rows for t in run.snapshot.tables} == {
        "public.Mixed Case": 300, "public.accounts": 500, "public.events": 800}
    run_silver(settings, spark)

    workload = Workload(pg_conn, seed=19)
    workload.run(150)
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(dataclasses.replace(settings, silver_spark_threshold_rows=0), spark)  # Spark

    with pg_conn.cursor() as cur:
        cur.execute('TRUNCATE "Mixed Case"')
        cur.execute("""INSERT INTO "Mixed Case" SELECT g, 'p', 'after truncate ' || g
                       FROM generate_series(1, 40) g""")
    workload.run(100)
    _crash_after_bronze_commit(pg_dsn, lake)  # killed between bronze commit and slot advance
    workload.run(50)
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)

    apply_signal(settings, parse_signal("s19", "execute-snapshot",
                                        {"data-collections": ["public.accounts"]}),
                 chunk_size=128)
    report = run_incremental(settings)
    assert [t.status for t in report.tables] == ["done"]
    assert [p.status for p in ProgressStore(lake, settings.slot).all()] == ["done"]
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)

    with pg_conn.cursor() as cur:
        cur.execute("CHECKPOINT")
        cur.execute("SELECT count(*) FROM accounts")
        accounts = cur.fetchone()[0]
    for table, key in TABLES:
        assert_silver_equals_source(pg_conn, table_uri(lake, "silver", "public", table),
                                    "public", table, key)
    # every kind of change reached bronze, the crash doubled nothing
    mixed = bronze_ops(lake, "Mixed Case")
    assert mixed["t"] == 1 and sum(n for k, n in mixed.items() if k.startswith("r:")) == 300
    events = bronze_ops(lake, "events")
    assert {"c", "u", "d"} <= events.keys()
    expected = workload.expected["events"]
    assert (events["c"], events["u"], events["d"]) == (expected["c"], expected["u"],
                                                       expected["d"])
    assert bronze_ops(lake, "accounts")["r:incremental"] == accounts

    # Everything lives in the bucket; nothing was written to local disk under the root.
    assert not Path("s3:").exists()
    fs, base = filesystem(lake)
    names = {i.path[len(base) + 1:].split("/")[0]
             for i in fs.get_file_info(pafs.FileSelector(base, recursive=False))}
    assert {"bronze", "silver", "_pgcdc"} <= names

    # Read straight from the bucket by other engines.
    uri = table_uri(lake, "silver", "public", "events")
    opts = storage_options(uri)
    assert opts is not None and SECRET_KEY not in repr(settings)
    delta = DeltaTable(uri, storage_options=opts)
    live = delta.to_pyarrow_dataset().to_table(filter=~pc.field("__deleted"))
    with pg_conn.cursor() as cur:
        cur.execute("SELECT count(*), sum(id) FROM events")
        count, total = cur.fetchone()
    assert (live.num_rows, pc.sum(live["id"]).as_py()) == (count, total)

    import polars as pl

    frame = pl.read_delta(uri, storage_options=opts).filter(~pl.col("__deleted"))
    assert (frame.height, frame["id"].sum()) == (count, total)

    import duckdb  # its httpfs/delta extensions cannot be installed offline: Arrow from S3

    files = [f.split("://", 1)[1] for f in delta.file_uris()]
    dataset = pads.dataset(files, format="parquet", filesystem=filesystem(uri)[0])
    got = duckdb.sql("SELECT count(*), sum(id) FROM dataset WHERE NOT __deleted").fetchone()
    assert got == (count, total)
    assert isinstance(dataset.schema, pa.Schema)

    # Silver upkeep on the bucket: compaction rewrites, vacuum deletes the replaced files.
    from pgcdc_dagster.lake.upkeep import compact, vacuum

    before = len(DeltaTable(uri, storage_options=opts).file_uris())
    result = compact(uri, ["id"], 64 << 20)
    assert before > 1 and result.groups >= 1 and result.files_removed > result.files_added
    assert vacuum(uri, 0) >= result.files_removed  # and what earlier MERGEs replaced
    assert_silver_equals_source(pg_conn, uri, "public", "events", ["id"])
