"""Initial-snapshot benchmark: our end-to-end rate against raw COPY on the same tables.

Prints the raw ``COPY (SELECT ...) TO STDOUT (FORMAT binary)`` rate of the tables (PostgreSQL
alone, into a byte-counting sink: the limit), our rate from PostgreSQL to committed bronze
and silver Delta tables (``run_snapshot``: new slot with an exported snapshot, key-range
chunks read by Spark tasks, Parquet, delta-rs commits), and their ratio (target:
>= 0.5). Raw and ours are measured alternately (``--repeat`` pairs), so both see the same
machine load; it prints the ratio of the best times, the best and median of the per-pair
ratios, the load average, and the CPU seconds each side used (PostgreSQL's processes plus
this process and its children: the Spark JVM and its Python workers), which is what decides
the ratio on a small machine where PostgreSQL and the Spark tasks share the cores. The first
snapshot of a fresh Spark session (Python workers starting) is reported apart.

``--whole-process`` adds the same snapshot taken by a whole ``dagster job execute -m
pgcdc_dagster.definitions -j initial_snapshot`` process (fresh ``DAGSTER_HOME``, default
instance, its own slot), as a user runs it: its rate ÷ the raw COPY measured just before it
(target: >= 0.3; the engine's ratio above is the steady state, target >= 0.6), the
process's peak RSS, and where its time went: the CLI and Dagster's set-up before the run
starts, the run's start to the capture step, the snapshot step's own timeline (when the Spark
JVM was asked for and was ready, the slot created, the chunks planned, the first chunk, the
chunks read and committed; ``SnapshotReport.timeline``) and the rest of the process. The
engine's timeline of its best run is printed too. ``--tables orders`` snapshots one table
(``--rows`` all in it).

``--repeat 0 --whole-process`` times whole processes only (no Spark in the bench's own
process); ``--whole-repeat N`` times N of them, each after its own raw COPY.

    .venv/bin/python bench/bench_snapshot.py [--rows 2000000] [--repeat 3] [--whole-process]
        [--whole-repeat 1] [--tables orders,metrics]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psycopg2

from bench.bench_stream import _RSS, WholeProcess
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import run_snapshot
from pgcdc_dagster.postgres.local_cluster import LocalCluster, tls_overrides
from pgcdc_dagster.spark.lazy import LazySpark
from pgcdc_dagster.spark.session import open_session

MASTER = "local[2]"
THRESHOLD = [0]
"""``snapshot_spark_threshold_rows`` of the in-process runs (``--threshold``; 0: Spark)."""

TABLES = {
    "orders": """CREATE TABLE orders (id bigint PRIMARY KEY, customer int, status text,
                 amount numeric(12,2), placed timestamptz, note text, flag boolean)""",
    "metrics": """CREATE TABLE metrics (id bigint PRIMARY KEY, host text, value double precision,
                  at timestamptz, day date, tags jsonb)""",
}
FILL = {
    "orders": """INSERT INTO orders SELECT g, g %% 10007, 'status-' || (g %% 7),
                 (g %% 100000) / 100.0, now() - g * interval '1 second',
                 repeat('n', g %% 40), g %% 3 = 0
                 FROM generate_series(1, %s) g""",
    "metrics": """INSERT INTO metrics SELECT g, 'host-' || (g %% 50), g * 0.25,
                  now() - g * interval '1 minute', current_date - (g %% 1000),
                  jsonb_build_object('k', g %% 13) FROM generate_series(1, %s) g""",
}


def fill_tables(dsn: str, rows: int, tables: list[str]) -> int:
    """Create and fill the benchmark tables (``rows`` across them); rows per table."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    per_table = rows // len(tables)
    with conn.cursor() as cur:
        for name in tables:
            cur.execute(TABLES[name])
            cur.execute(FILL[name] % per_table)
        cur.execute("VACUUM ANALYZE")
    conn.close()
    return per_table


class Sink:
    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self.bytes += len(data)
        return len(data)


def tree_cpu_seconds(roots: list[int]) -> float:
    """User + system CPU of the processes under ``roots`` (reaped children included)."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0.0
    children: dict[int, list[int]] = {}
    used: dict[int, int] = {}
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(p))
        used[int(p)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total, stack = 0, list(roots)
    while stack:
        pid = stack.pop()
        total += used.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total / os.sysconf("SC_CLK_TCK")


def measured(roots: list[int], run: Callable[[], tuple[float, int]]) -> tuple[float, int, float]:
    """``run``'s (seconds, count) and the CPU seconds the processes under ``roots`` used."""
    before = tree_cpu_seconds(roots)
    seconds, count = run()
    return seconds, count, tree_cpu_seconds(roots) - before


def raw_copy_seconds(dsn: str, tables: list[str]) -> tuple[float, int]:
    conn = psycopg2.connect(dsn)
    sink = Sink()
    started = time.perf_counter()
    with conn.cursor() as cur:
        for table in tables:
            cur.copy_expert(f"COPY (SELECT * FROM {table}) TO STDOUT (FORMAT binary)", sink)
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed, sink.bytes


def pattern(tables: list[str]) -> str:
    return f"public\\.({'|'.join(tables)})"


def timeline_text(timeline: list[tuple[str, float]]) -> str:
    return ", ".join(f"{event} {at:.2f}" for event, at in timeline)


TIMELINES: dict[str, list[tuple[str, float]]] = {}
"""The snapshot step's timeline of each in-process run, by its name."""


def snapshot_seconds(dsn: str, root: Path, name: str, spark: LazySpark,
                     tables: list[str]) -> tuple[float, int]:
    settings = CaptureSettings(dsn=dsn, lakehouse=str(root / name), slot=name,
                               publication=name, include=(pattern(tables),),
                               snapshot_spark_threshold_rows=THRESHOLD[0])
    started = time.perf_counter()
    report = run_snapshot(settings, spark, force=True,
                          progress=lambda _line: None)
    elapsed = time.perf_counter() - started
    TIMELINES[name] = report.timeline
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    conn.close()
    return elapsed, report.rows


def whole_process(job: WholeProcess) -> tuple[float, int, list[str]]:
    """Seconds, peak RSS and the breakdown of one ``dagster job execute -j
    initial_snapshot`` (each output line timed as it arrives)."""
    cli = Path(sys.executable).parent / "dagster"
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _RSS, str(cli), "job", "execute", "-m",
         "pgcdc_dagster.definitions", "-j", "initial_snapshot"],
        env=job.env, cwd=job.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = [(time.perf_counter() - started, line.rstrip()) for line in proc.stdout]
    proc.wait()
    seconds = time.perf_counter() - started
    text = "\n".join(line for _, line in lines)
    if proc.returncode != 0 or "RUN_SUCCESS" not in text:
        sys.exit(f"initial_snapshot failed:\n{text[-5000:]}")
    rss = [int(line.split()[1]) * 1024 for _, line in lines if line.startswith("MAXRSS ")]

    def first(marker: str) -> float:
        return next((at for at, line in lines if marker in line), float("nan"))

    run_start, step_start = first("RUN_START"), first("STEP_START")
    step_end, run_end = first("STEP_SUCCESS"), first("RUN_SUCCESS")
    timeline = next((line.split("start): ", 1)[1] for _, line in lines
                     if "snapshot timeline" in line), "?")
    breakdown = [
        f"CLI and Dagster set-up before the run starts {run_start:.2f} s",
        f"run start -> capture step {step_start - run_start:.2f} s",
        f"snapshot step (s from its start, the step began at {step_start:.2f} s): {timeline}",
        f"step end (events, checks) -> run success {run_end - step_end:.2f} s, "
        f"-> process exit {seconds - run_end:.2f} s"
        + (" (nan: a Dagster line not found)" if step_end != step_end else ""),
    ]
    return seconds, rss[-1] if rss else 0, breakdown


def whole_processes(dsn: str, root: Path, tables: list[str], total: int, repeat: int,
                    best_raw: float | None = None) -> None:
    """Time ``repeat`` whole processes, each right after a raw COPY (same load), each on a
    fresh ``DAGSTER_HOME``, lakehouse and slot; print each and the best ratio."""
    ratios = []
    for i in range(max(1, repeat)):
        raw_now, _ = raw_copy_seconds(dsn, tables)
        load_job = os.getloadavg()[0]
        home = root / f"whole{i}"
        home.mkdir()
        job_s, rss, breakdown = whole_process(WholeProcess(home, dsn, pattern(tables)))
        shutil.rmtree(home, ignore_errors=True)  # the lakehouse it wrote
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot('bench_job')")
        conn.close()
        ratios.append(raw_now / job_s)
        best = "" if best_raw is None else f" (best raw: {best_raw / job_s:.3f})"
        print(f"whole process (dagster job execute -j initial_snapshot): "
              f"{total / job_s:,.0f} rows/s ({job_s:.1f} s; raw COPY just before "
              f"{raw_now:.2f} s), ratio {raw_now / job_s:.3f}{best}, peak RSS "
              f"{rss / 2**20:.0f} MiB; load {load_job:.1f} -> {os.getloadavg()[0]:.1f}")
        for item in breakdown:
            print(f"  {item}")
    if len(ratios) > 1:
        print(f"whole-process ratios: {', '.join(f'{r:.3f}' for r in ratios)}; best "
              f"{max(ratios):.3f}, median {statistics.median(ratios):.3f}")


def cluster_pid(data_dir: Path) -> int:
    """The postmaster's PID (its backends are its children)."""
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows across all tables")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tables", default=",".join(TABLES),
                        help=f"comma-separated, among {', '.join(TABLES)}")
    parser.add_argument("--whole-process", action="store_true",
                        help="also time a whole dagster job execute -j initial_snapshot")
    parser.add_argument("--whole-repeat", type=int, default=1,
                        help="whole processes to time (each after its own raw COPY)")
    parser.add_argument("--remote", default=None,
                        help="a Spark Connect server (sc://host:port) instead of local[2]")
    parser.add_argument("--threshold", type=int, default=0,
                        help="snapshot_spark_threshold_rows (0: Spark reads the chunks; above "
                        "the rows: read in this process)")
    parser.add_argument("--sslmode", default="disable", choices=("disable", "require"),
                        help="require: the cluster accepts TLS and every connection (raw "
                             "COPY and ours) uses it")
    args = parser.parse_args()
    THRESHOLD[0] = args.threshold
    tables = [t for t in args.tables.split(",") if t]
    if not tables or any(t not in TABLES for t in tables):
        sys.exit(f"--tables: choose among {', '.join(TABLES)}")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = Path(tempfile.mkdtemp(prefix="pgcdc-bench-snap-"))
    tls = tls_overrides(root / "certs") if args.sslmode == "require" else {}
    cluster = LocalCluster(root / "pg", overrides=tls).start()
    dsn = f"{cluster.dsn} sslmode={args.sslmode}"
    try:
        per_table = fill_tables(dsn, args.rows, tables)
        total = per_table * len(tables)
        if args.repeat < 1:  # whole processes only: no Spark in this process
            raw_copy_seconds(dsn, tables)  # warm the cache
            whole_processes(dsn, root, tables, total, args.whole_repeat)
            return
        # The handle a run's snapshot gets (the spark resource's): started as the snapshot
        # step starts it, its workers warmed (spark/lazy.py); the start is not snapshot work.
        spark = LazySpark(lambda: open_session(MASTER, remote=args.remote),
                          None if args.remote else MASTER)
        if args.threshold == 0:
            spark.start(on_ready=LazySpark.warm)
            spark.warm()
        raw_copy_seconds(dsn, tables)  # warm the cache
        roots = [cluster_pid(cluster.data_dir), os.getpid()]
        load_start = os.getloadavg()
        cold, rows = snapshot_seconds(dsn, root, "cold", spark, tables)
        assert rows == total, (rows, total)
        raws: list[float] = []
        ours: list[float] = []
        raw_cpu: list[float] = []
        our_cpu: list[float] = []
        raw_bytes = 0
        for i in range(args.repeat):
            elapsed, raw_bytes, cpu = measured(
                roots, lambda: raw_copy_seconds(dsn, tables))
            raws.append(elapsed)
            raw_cpu.append(cpu)
            elapsed, rows, cpu = measured(
                roots, partial(snapshot_seconds, dsn, root, f"warm{i}", spark, tables))
            assert rows == total, (rows, total)
            ours.append(elapsed)
            our_cpu.append(cpu)
        load_end = os.getloadavg()
        pairs = [r / o for r, o in zip(raws, ours, strict=True)]
        raw_s, ours_s = min(raws), min(ours)
        print(f"connections: sslmode={args.sslmode}")
        print(f"rows: {total:,} in {len(tables)} tables ({raw_bytes / 1e6:.0f} MB as COPY binary)")
        print(f"raw COPY binary (limit): {total / raw_s:,.0f} rows/s ({raw_s:.2f} s best, "
              f"{statistics.median(raws):.2f} s median; {min(raw_cpu):.2f} CPU s)")
        print(f"pgcdc snapshot to committed bronze+silver: {total / ours_s:,.0f} rows/s "
              f"({ours_s:.2f} s best, {statistics.median(ours):.2f} s median; "
              f"{min(our_cpu):.2f} CPU s); first in a fresh Spark session: "
              f"{total / cold:,.0f} rows/s ({cold:.2f} s)")
        print(f"load average: {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end "
              f"({os.cpu_count()} CPUs)")
        print(f"ratio per pair: {', '.join(f'{r:.2f}' for r in pairs)}; best "
              f"{max(pairs):.2f}, median {statistics.median(pairs):.2f}")
        print(f"CPU seconds ours/raw: {min(our_cpu) / max(min(raw_cpu), 1e-9):.1f}")
        print(f"ratio: {ours_s and raw_s / ours_s:.2f}")
        best = f"warm{ours.index(ours_s)}"
        print(f"engine timeline of its best run (s): {timeline_text(TIMELINES[best])}")
        spark.close()
        if args.whole_process:
            shutil.rmtree(root / "cold", ignore_errors=True)  # the disk the job writes to
            for i in range(args.repeat):
                shutil.rmtree(root / f"warm{i}", ignore_errors=True)
            whole_processes(dsn, root, tables, total, args.whole_repeat, raw_s)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)  # ~800 MB of data and lakehouse per run


if __name__ == "__main__":
    main()
