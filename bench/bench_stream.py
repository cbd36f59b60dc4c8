"""Stream benchmark: micro-batches end to end against the raw peek rate of the same WAL.

Prints the raw ``pg_logical_slot_peek_binary_changes`` rate over the pending WAL (PostgreSQL
alone, COPY into a byte-counting sink: the limit), our end-to-end rate (peek -> bronze ->
silver -> advance, several windows), their ratio (target: >= 0.25), the
commit-to-silver latency of a small change after one micro-batch run, and the latency under
the scheduled loop: the ``cdc_microbatch`` Dagster job run again ``--loop-interval`` seconds
after each run while single rows are committed at random moments (``--loop-samples``).

``--repeat N`` measures N rounds (fresh changes each, same cluster) and prints the best and
median ratio with the load average of each round (the machine is shared: compare ratios,
not rates). ``--stages`` adds the time spent per stage (wall time inside each function:
portions are converted inside the peek and Parquet parts are written by a background
thread, so stages overlap and do not add up to the total).

``--whole-process`` adds, next to the engine figure, the same changes read by a whole
``dagster job execute -m pgcdc_dagster.definitions -j cdc_microbatch`` process (fresh
``DAGSTER_HOME``, default instance, its own slot over the same WAL): its rate ÷ the raw peek
(target: >= 0.15) and the process's peak RSS (target without Spark: < 400 MB).
Beside it, Dagster's own floor: the same CLI executing a one-op job that does nothing
(in-process executor, like ours) on an instance of its own, and the ratio a job that took
only that long would reach: no job run by ``dagster job execute`` can do better.

    .venv/bin/python bench/bench_stream.py [--changes 1000000] [--repeat 3] [--stages]
        [--whole-process]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2
from deltalake import DeltaTable

import pgcdc_dagster.postgres.local_cluster as local_cluster_module
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.postgres.local_cluster import LocalCluster
from pgcdc_dagster.spark.session import build_session


class Sink:
    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self.bytes += len(data)
        return len(data)


def raw_peek(dsn: str, slot: str, publication: str) -> tuple[int, float]:
    """Rows and seconds of one COPY of the whole pending window (no decoding on our side)."""
    conn = psycopg2.connect(dsn)
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_flush_lsn()")
        upto = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, %s, NULL, "
                    "'proto_version', '1', 'publication_names', %s)", (slot, upto, publication))
        rows = cur.fetchone()[0]
        sink = Sink()
        started = time.perf_counter()
        cur.copy_expert(cur.mogrify(
            "COPY (SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes(%s, %s, NULL, "
            "'proto_version', '1', 'publication_names', %s, 'messages', 'true')) TO STDOUT "
            "(FORMAT binary)", (slot, upto, publication)).decode(), sink)
        elapsed = time.perf_counter() - started
    conn.close()
    return int(rows), elapsed


STAGES: dict[str, float] = collections.defaultdict(float)


def _timed(owner: Any, name: str, label: str) -> None:
    """Replace ``owner.name`` by a wrapper adding its wall time to ``STAGES[label]``."""
    func: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            STAGES[label] += time.perf_counter() - started

    setattr(owner, name, wrapper)


def install_stage_timers() -> None:
    import pgcdc_dagster.capture.bronze_write as bronze_write
    import pgcdc_dagster.capture.silver_apply as silver_apply
    import pgcdc_dagster.capture.stream as stream

    _timed(stream, "peek_window", "peek + decode (+ portions converted inside)")
    _timed(bronze_write.BronzeWindowWriter, "add", "bronze writer: convert, queue parts")
    _timed(bronze_write, "bronze_from_changes", "  bronze conversion (envelope)")
    _timed(bronze_write, "write_part", "  Parquet write (background thread)")
    _timed(bronze_write.BronzeWindowWriter, "commit", "bronze Delta commit (waits for parts)")
    _timed(stream, "advance_slot", "slot advance")
    _timed(silver_apply, "read_files", "silver: read bronze parts")
    _timed(silver_apply, "prepare_arrow", "silver: prepare (Arrow)")
    _timed(silver_apply, "silver_from_images", "silver: native values")
    _timed(silver_apply, "merge_batch", "silver: merge (file rewrite)")


def generate(cur: Any, per: int, offset: int) -> None:
    """``4 * per`` changes: inserts then updates, 50k rows per transaction, two tables."""
    for lo in range(offset, offset + per, 50_000):
        hi = min(offset + per, lo + 50_000)
        cur.execute("INSERT INTO orders SELECT g, g %% 1000, 'new', g / 100.0, now() "
                    "FROM generate_series(%s, %s) g", (lo + 1, hi))
        cur.execute("INSERT INTO events SELECT g, 'k' || (g %% 9), md5(g::text), now() "
                    "FROM generate_series(%s, %s) g", (lo + 1, hi))
    for lo in range(offset, offset + per, 50_000):
        hi = min(offset + per, lo + 50_000)
        cur.execute("UPDATE orders SET status = 'paid', amount = amount + 1 "
                    "WHERE id BETWEEN %s AND %s", (lo + 1, hi))
        cur.execute("UPDATE events SET kind = 'seen' WHERE id BETWEEN %s AND %s",
                    (lo + 1, hi))
    cur.execute("CHECKPOINT")


def loop_latency(settings: CaptureSettings, cur: Any, samples: int, interval: float) -> None:
    """Commit-to-silver latency under the scheduled loop.

    The ``cdc_microbatch`` Dagster job (in process, with the real resources) runs again
    ``interval`` seconds after each run ends, as a schedule would fire it; meanwhile single
    rows are committed at random moments and each one's latency is the time until a delta-rs
    read of silver shows it. Expected: about ``interval / 2`` plus one run's duration.
    """
    import random
    import threading

    from pgcdc_dagster.definitions import build_definitions
    from pgcdc_dagster.resources import (
        CaptureResource,
        LakehouseResource,
        PostgresResource,
        SparkResource,
    )

    definitions = build_definitions([("public", "orders"), ("public", "events")], {
        "postgres": PostgresResource(dsn=settings.dsn),
        "lakehouse": LakehouseResource(root=settings.lakehouse),
        "capture": CaptureResource(tables="public\\..*", slot=settings.slot,
                                   publication=settings.publication),
        "spark": SparkResource(),
    })
    job = definitions.resolve_job_def("cdc_microbatch")
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    job.execute_in_process(run_config=quiet)  # catch up first; the loop measures steady state
    stop = threading.Event()
    runs: list[float] = []

    def loop() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            assert job.execute_in_process(run_config=quiet).success
            runs.append(time.perf_counter() - started)
            stop.wait(interval)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    rng = random.Random(7)
    uri = table_uri(settings.lakehouse, "silver", "public", "orders")
    latencies = []
    for i in range(samples):
        time.sleep(rng.uniform(0.0, interval + 1.0))
        key = 20_000_000_000 + i
        cur.execute("INSERT INTO orders VALUES (%s, 1, 'loop', 1, now())", (key,))
        committed = time.perf_counter()
        while DeltaTable(uri).to_pyarrow_table(filters=[("id", "=", key)]).num_rows == 0:
            time.sleep(0.05)
        latencies.append(time.perf_counter() - committed)
    stop.set()
    thread.join()
    print(f"commit-to-silver latency under the scheduled loop (cdc_microbatch job in process, "
          f"{interval:.1f} s between runs, runs took median {statistics.median(runs):.2f} s): "
          f"median {statistics.median(latencies):.2f} s, max {max(latencies):.2f} s "
          f"over {samples} changes")


_RSS = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
        "print('MAXRSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
        "file=sys.stderr); sys.exit(p.returncode)")
"""Runs a command and prints the peak RSS (KiB) of its largest process."""


class WholeProcess:
    """A second capture of the same tables, run by the Dagster CLI as a user runs it."""

    def __init__(self, root: Path, dsn: str, tables: str = "public\\..*") -> None:
        home = root / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        self.env = {**os.environ, "PGCDC_PG_DSN": dsn, "PGCDC_LAKEHOUSE": str(root / "lake_job"),
                    "PGCDC_TABLES": tables, "PGCDC_SLOT": "bench_job",
                    "PGCDC_PUBLICATION": "bench", "DAGSTER_HOME": str(home),
                    "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
        self.cwd = Path(local_cluster_module.__file__).resolve().parents[2]

    def run(self, job: str) -> tuple[float, int]:
        """Seconds and peak RSS (bytes) of one ``dagster job execute``."""
        cli = Path(sys.executable).parent / "dagster"
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", _RSS, str(cli), "job", "execute", "-m",
             "pgcdc_dagster.definitions", "-j", job],
            env=self.env, cwd=self.cwd, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if proc.returncode != 0 or "RUN_SUCCESS" not in proc.stdout + proc.stderr:
            sys.exit(f"{job} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        rss = [int(line.split()[1]) for line in proc.stderr.splitlines()
               if line.startswith("MAXRSS ")]
        return seconds, rss[-1] * 1024 if rss else 0


_NOOP_JOB = """
import dagster as dg


@dg.op
def nothing() -> None:
    pass


@dg.job(executor_def=dg.in_process_executor)
def noop() -> None:
    nothing()
"""
"""A job that does nothing, run the way ours are: Dagster's floor for any job."""


def dagster_floor(root: Path, runs: int = 2) -> float:
    """Seconds of the fastest of ``runs`` ``dagster job execute`` of :data:`_NOOP_JOB`, on
    an instance of its own (after a first run that creates its storage)."""
    home = root / "dagster_floor"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    (home / "noop_job.py").write_text(_NOOP_JOB)
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    cli = Path(sys.executable).parent / "dagster"
    best = float("inf")
    for _ in range(runs + 1):
        started = time.perf_counter()
        subprocess.run([str(cli), "job", "execute", "-f", str(home / "noop_job.py"), "-j",
                        "noop"], env=env, cwd=home, capture_output=True, check=True)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--stages", action="store_true")
    parser.add_argument("--latency-samples", type=int, default=5)
    parser.add_argument("--loop-samples", type=int, default=5,
                        help="changes committed at random moments while the cdc_microbatch "
                             "Dagster job runs in a loop (0: skip)")
    parser.add_argument("--loop-interval", type=float, default=2.0,
                        help="seconds between the end of one loop run and the next start "
                             "(a schedule's interval, shortened)")
    parser.add_argument("--keep", action="store_true", help="keep the cluster and lake files")
    parser.add_argument("--window-mb", type=int, default=0,
                        help="window_max_bytes in MiB (default: the product default)")
    parser.add_argument("--window-changes", type=int, default=-1,
                        help="window_max_changes (default: the product default)")
    parser.add_argument("--whole-process", action="store_true",
                        help="also time a whole dagster job execute of the same changes")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.stages:
        install_stage_timers()
    root = Path(tempfile.mkdtemp(prefix="pgcdc-bench-stream-"))
    cluster = LocalCluster(root / "pg").start()
    try:
        conn = psycopg2.connect(cluster.dsn)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("CREATE TABLE orders (id bigint PRIMARY KEY, customer int, status text, "
                    "amount numeric(12,2), updated timestamptz)")
        cur.execute("CREATE TABLE events (id bigint PRIMARY KEY, kind text, payload text, "
                    "at timestamptz)")
        settings = CaptureSettings(dsn=cluster.dsn, lakehouse=str(root / "lake"),
                                   include=("public\\..*",), slot="bench", publication="bench")
        if args.window_mb:
            settings = dataclasses.replace(settings, window_max_bytes=args.window_mb << 20)
        if args.window_changes >= 0:
            settings = dataclasses.replace(settings, window_max_changes=args.window_changes)
        print(f"windows: at most {settings.window_max_bytes >> 20} MiB of WAL and "
              f"{settings.window_max_changes:,} changes")
        spark = build_session()
        run_bronze(settings, spark, force_snapshot_step=True)
        run_silver(settings, spark)
        whole = WholeProcess(root, cluster.dsn) if args.whole_process else None
        if whole is not None:  # its slot and baseline, before the changes
            whole.run("initial_snapshot")
        per = args.changes // 4
        changes = per * 4
        ratios: list[tuple[float, float, tuple[float, float, float]]] = []
        for round_no in range(args.repeat):
            generate(cur, per, round_no * per)
            raw_peek(cluster.dsn, "bench", "bench")  # warm
            rows, raw_s = raw_peek(cluster.dsn, "bench", "bench")
            raw_rate = rows / raw_s
            STAGES.clear()
            load = os.getloadavg()
            started = time.perf_counter()
            report = run_bronze(settings, spark, force_snapshot_step=False)
            bronze_s = time.perf_counter() - started
            run_silver(settings, spark)
            ours_s = time.perf_counter() - started
            assert report.stream is not None
            got = sum(sum(o.values()) for o in report.stream.events_by_table().values())
            assert got == changes, (got, changes)
            ours_rate = changes / ours_s
            ratios.append((ours_rate / raw_rate, ours_rate, load))
            print(f"round {round_no + 1}: load average {load[0]:.1f} {load[1]:.1f} "
                  f"{load[2]:.1f}")
            print(f"  changes: {changes:,} ({rows:,} pgoutput rows incl. BEGIN/COMMIT/RELATION)")
            print(f"  raw peek (limit): {raw_rate:,.0f} rows/s ({raw_s:.2f} s)")
            print(f"  pgcdc peek -> bronze -> silver -> advance: {ours_rate:,.0f} changes/s "
                  f"({ours_s:.1f} s: bronze {bronze_s:.1f} s, silver {ours_s - bronze_s:.1f} s; "
                  f"{len(report.stream.windows)} windows)")
            print(f"  ratio: {ours_rate / raw_rate:.3f}")
            print("  windows (changes, WAL MiB): " + ", ".join(
                f"{w.changes:,} {(int(w.end) - int(w.start)) / 2**20:.0f}"
                for w in report.stream.windows))
            for label, seconds in STAGES.items():
                print(f"    {label:48s} {seconds:6.2f} s")
            if whole is not None:
                job_s, rss = whole.run("cdc_microbatch")
                print(f"  whole process (dagster job execute -j cdc_microbatch): "
                      f"{changes / job_s:,.0f} changes/s ({job_s:.1f} s), ratio "
                      f"{changes / job_s / raw_rate:.3f}, peak RSS {rss / 2**20:.0f} MiB")
                floor_s = dagster_floor(root)
                print(f"  Dagster's floor (dagster job execute of a one-op job doing nothing): "
                      f"{floor_s:.2f} s; a job taking only that long: ratio "
                      f"{changes / floor_s / raw_rate:.3f}")
        if args.repeat > 1:
            values = [r[0] for r in ratios]
            print(f"ratio over {args.repeat} rounds: best {max(values):.3f}, "
                  f"median {statistics.median(values):.3f} (loads "
                  + ", ".join(f"{r[2][0]:.1f}" for r in ratios) + ")")

        latencies = []
        uri = table_uri(settings.lakehouse, "silver", "public", "orders")
        for i in range(args.latency_samples):
            key = 10_000_000_000 + i
            cur.execute("INSERT INTO orders VALUES (%s, 1, 'latency', 1, now())", (key,))
            committed = time.perf_counter()
            run_bronze(settings, spark, force_snapshot_step=False)
            run_silver(settings, spark)
            found = DeltaTable(uri).to_pyarrow_table(filters=[("id", "=", key)]).num_rows
            assert found == 1
            latencies.append(time.perf_counter() - committed)
        if latencies:
            print(f"commit-to-silver latency of a small change (one micro-batch run, no "
                  f"schedule wait): median {statistics.median(latencies):.2f} s, "
                  f"max {max(latencies):.2f} s")
        if args.loop_samples:
            loop_latency(settings, cur, args.loop_samples, args.loop_interval)
        spark.stop()
    finally:
        cluster.stop()
        if not args.keep:  # a 1M-change round leaves ~1 GB of WAL and Delta files
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
