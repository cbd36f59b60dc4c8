"""The end-to-end scenario, one definition for every place it runs.

The same steps and the same assertions run through the user's path (``dagster job execute``
subprocesses, :mod:`tests.dagster.test_object_storage_cli`) and through the engine on a
standalone Spark cluster (:mod:`tests.support.spark_cluster`), for a local and an ``s3://``
lakehouse: the initial snapshot, micro-batches with inserts, updates, deletes and a
TRUNCATE, a run SIGKILLed between its bronze commit and the slot advance and its rerun, an
incremental snapshot of one table, then silver equal to the source, every bronze event
exactly once, and the tables read back by delta-rs, Polars and DuckDB (straight from the
bucket for ``s3://``).

A driver provides the steps (:class:`Steps`); :func:`run` does the rest.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import DeltaTable

from pgcdc_dagster.capture.faults import ENV as FAULT_ENV
from pgcdc_dagster.capture.incremental import apply_signal, run_incremental
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.dblog import parse_signal
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.storage import filesystem, storage_options
from pgcdc_dagster.postgres.slot_lock import slot_lock_holder
from tests.support.compare import assert_silver_equals_source
from tests.support.workload import SCHEMA, Workload

TABLES = (("accounts", ["id"]), ("events", ["id"]), ("Mixed Case", ["Key", "part"]))
SNAPSHOT_ROWS = {"accounts": 500, "events": 800, "Mixed Case": 300}
INCREMENTAL_TABLE = "accounts"
SPARK_SILVER_TABLE = "events"
INCLUDE = r"public\..*"  # as tests.support.crash_runner captures
INCREMENTAL_CHUNK = 256  # accounts: 3 chunks
ROOT = Path(__file__).resolve().parents[2]


class Steps(Protocol):
    """One way of running the capture: each step leaves bronze and silver caught up, except
    :meth:`killed_microbatch`, which dies after its bronze commit (before the slot advance)."""

    def snapshot(self) -> None: ...

    def microbatch(self) -> None: ...

    def killed_microbatch(self) -> None: ...

    def incremental(self, table: str) -> None: ...


class EngineSteps:
    """The steps through the capture engine (no Dagster) on a given Spark session. In the
    first micro-batch, the silver batch of ``events`` is prepared by Spark (its bronze files
    read on the executors), as a batch above ``silver_spark_threshold_rows`` would be; every
    other in Arrow."""

    def __init__(self, spark: Any, dsn: str, lake: str, slot: str, **settings: Any) -> None:
        self.spark = spark
        self.settings = CaptureSettings(dsn=dsn, lakehouse=lake, include=(INCLUDE,), slot=slot,
                                        publication=slot, **settings)
        self.chunks = 0
        self.executors: list[str] = []
        """``host:pid`` of the Spark Python workers that read the snapshot's chunks."""
        self.spark_silver_batches = 0

    def snapshot(self) -> None:
        run = run_bronze(self.settings, self.spark, force_snapshot_step=True)
        assert run.snapshot is not None and run.snapshot.performed
        self.chunks = sum(t.chunks for t in run.snapshot.tables)
        self.executors = list(run.snapshot.executors)
        run_silver(self.settings, self.spark)

    def microbatch(self) -> None:
        run_bronze(self.settings, self.spark, force_snapshot_step=False)
        if self.spark_silver_batches:
            run_silver(self.settings, self.spark)
            return
        spark_table = [("public", SPARK_SILVER_TABLE)]  # one: each costs a minute on a cluster
        reports = run_silver(dataclasses.replace(self.settings, silver_spark_threshold_rows=0),
                             self.spark, only=spark_table)
        self.spark_silver_batches = sum(1 for r in reports if r.events)
        assert self.spark_silver_batches == 1, reports
        run_silver(self.settings, self.spark)

    def killed_microbatch(self) -> None:
        s = self.settings
        proc = subprocess.run(
            [sys.executable, "-m", "tests.support.crash_runner", s.dsn, s.lakehouse, s.slot],
            cwd=ROOT, env=dict(os.environ, **{FAULT_ENV: "after_bronze_commit"}),
            capture_output=True, text=True, timeout=300)
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
        deadline = time.monotonic() + 60  # the server notices the dead client's session
        while slot_lock_holder(s.dsn, s.slot) is not None and time.monotonic() < deadline:
            time.sleep(0.2)

    def incremental(self, table: str) -> None:
        signal_ = parse_signal(f"e2e-{table}", "execute-snapshot",
                               {"data-collections": [f"public.{table}"]})
        apply_signal(self.settings, signal_, chunk_size=INCREMENTAL_CHUNK)
        report = run_incremental(self.settings)
        assert [t.status for t in report.tables] == ["done"], report
        self.microbatch()


def bronze_ops(lake: str, table: str) -> dict[str, int]:
    """Bronze events of ``public.<table>`` by op (``r:<snapshot kind>`` for reads)."""
    uri = table_uri(lake, "bronze", "public", table)
    data = DeltaTable(uri, storage_options=storage_options(uri)).to_pyarrow_table(
        columns=["op", "source"])
    out: dict[str, int] = {}
    for op, snap in zip(data["op"].to_pylist(),
                        pc.struct_field(data["source"], "snapshot").to_pylist(), strict=True):
        key = f"{op}:{snap}" if op == "r" else op
        out[key] = out.get(key, 0) + 1
    return out


def run(steps: Steps, conn: Any, lake: str, seed: int = 19) -> dict[str, Any]:
    """The scenario against the empty database ``conn`` (autocommit) and lakehouse ``lake``;
    returns what it checked, for the caller's own assertions."""
    seconds: dict[str, float] = {}

    def step(name: str, *args: str) -> None:  # timed, to keep an eye on the suite's time
        started = time.perf_counter()
        getattr(steps, name)(*args)
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started

    with conn.cursor() as cur:
        cur.execute(SCHEMA)
    step("snapshot")
    assert {t: sum(n for k, n in bronze_ops(lake, t).items() if k.startswith("r:"))
            for t in SNAPSHOT_ROWS} == SNAPSHOT_ROWS

    workload = Workload(conn, seed=seed)
    workload.run(150)
    with conn.cursor() as cur:
        cur.execute('TRUNCATE "Mixed Case"')
        cur.execute("""INSERT INTO "Mixed Case" SELECT g, 'p', 'after truncate ' || g
                       FROM generate_series(1, 40) g""")
    step("microbatch")

    workload.run(100)
    step("killed_microbatch")  # its window is in bronze, the slot was not advanced
    workload.run(50)
    step("microbatch")  # the rerun skips the committed window: nothing doubled

    step("incremental", INCREMENTAL_TABLE)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM accounts")
        accounts = cur.fetchone()[0]
        cur.execute("SELECT count(*), sum(id) FROM events")
        events_count, events_sum = cur.fetchone()

    for table, key in TABLES:
        assert_silver_equals_source(conn, table_uri(lake, "silver", "public", table),
                                    "public", table, key)
    mixed = bronze_ops(lake, "Mixed Case")
    assert mixed["t"] == 1, mixed
    events = bronze_ops(lake, "events")
    expected = workload.expected["events"]
    assert (events.get("c"), events.get("u"), events.get("d")) == (
        expected["c"], expected["u"], expected["d"]), (events, expected)
    assert bronze_ops(lake, "accounts")["r:incremental"] == accounts

    uri = table_uri(lake, "silver", "public", "events")
    read = read_back(uri)
    assert all(got == (events_count, events_sum) for got in read.values()), read
    return {"events": events, "expected": expected, "readers": sorted(read),
            "seconds": seconds}


def read_back(uri: str) -> dict[str, tuple[int, int]]:
    """(live rows, sum of ``id``) of a silver table as delta-rs, Polars and DuckDB read it,
    straight from where it lives."""
    import duckdb
    import polars as pl

    opts = storage_options(uri)
    delta = DeltaTable(uri, storage_options=opts)
    live = delta.to_pyarrow_dataset().to_table(filter=~pc.field("__deleted"))
    frame = pl.read_delta(uri, storage_options=opts).filter(~pl.col("__deleted"))
    # DuckDB's httpfs/delta extensions cannot be installed offline: it scans the Parquet files
    # delta-rs lists, through pyarrow's filesystem for the bucket.
    fs, _ = filesystem(uri)
    files = [f.split("://", 1)[1] if "://" in f else f for f in delta.file_uris()]
    db = duckdb.connect()
    db.register("silver", pads.dataset(files, format="parquet", filesystem=fs))
    got = db.sql("SELECT count(*), sum(id) FROM silver WHERE NOT __deleted").fetchone()
    assert got is not None
    return {"delta-rs": (live.num_rows, pc.sum(live["id"]).as_py()),
            "polars": (frame.height, frame["id"].sum()),
            "duckdb": (int(got[0]), int(got[1]))}


def run_each(spark: Any, runs: list[tuple[str, str]], prefix: str
             ) -> list[tuple[int, list[str], dict[str, float]]]:
    """The scenario once per ``(dsn, lakehouse)`` of ``runs``, at the same time, as captures
    sharing one Spark do (their own databases, slots and lakehouses), through ``spark`` (a
    session or a handle); per run: the chunks read, their executors and the steps' seconds."""
    import psycopg2

    def scenario(i: int, dsn: str, lake: str) -> tuple[int, list[str], dict[str, float]]:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        try:
            steps = EngineSteps(spark, dsn, lake, f"{prefix}{i}", snapshot_chunk_bytes=16 << 10,
                                snapshot_spark_threshold_rows=0)
            seconds = run(steps, conn, lake)["seconds"]
            return steps.chunks, steps.executors, seconds
        finally:
            conn.close()

    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(lambda item: scenario(item[0], *item[1]), enumerate(runs)))
