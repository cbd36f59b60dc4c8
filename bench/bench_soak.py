"""Soak benchmark: many micro-batches over a mixed workload, upkeep on its schedule.

Ten tables (``t0`` large, ``t1``..``t9`` small) are snapshotted, then ``--runs`` micro-batch
runs (bronze + silver, the project's runner) each follow a mix of writes on every table:
updates of random keys, updates of the newest keys, inserts of new keys, deletes. Every
``--upkeep-every`` runs the silver_maintenance upkeep (compaction, vacuum, checkpoint) runs
on every table. Per run it prints (and writes to ``--csv``): seconds, CPU seconds (this
process, Spark's JVM and PostgreSQL, exited children included; in the CSV also apart: this
process and its children, this process alone, PostgreSQL), bytes written to bronze and
silver, the most files any bronze / silver table has, the process's RSS and the bytes
allocated in all of Arrow's memory pools, the slot's lag, the time DuckDB takes to read the
large table's silver (the Parquet files delta-rs lists), the log a reader of the large
table's bronze / silver reads (latest checkpoint and the JSON commits after it, KB), the
Delta table opens of the run and their CPU time, and the load average. Arrow's pools are
the ones the Dagster code location sets (``--arrow-pool``); ``--malloc-trim`` returns freed memory
to the OS after each run (to tell retained from live memory); ``--profile`` writes cProfile
stats of the first and last 10 % of runs (the calling thread only). At the end the
capture catches up and every silver table is compared with its source (convergence), and
the target ratios are printed:

* the last 10 % of runs against the first 10 % (time; target <= 1.2; and CPU time),
* the most files per silver table (bound: about table bytes / target + the runs since the
  last upkeep),
* DuckDB's read of silver against its read right after compaction (target <= 1.2).

Bounded time (not in CI): the defaults take a few minutes on 2 cores.

    .venv/bin/python bench/bench_soak.py [--runs 60] [--upkeep-every 10]
        [--large-rows 1000000] [--small-rows 20000] [--target-file-bytes 1048576]
        [--large-scale 10] [--csv runs.csv] [--arrow-pool deployed|default]
        [--malloc-trim] [--profile PREFIX]
"""

from __future__ import annotations

import os
import sys

if not {"default", "--arrow-pool=default"} & set(sys.argv[1:]):
    # As a tuned deployment sets it (docs/operations.md, "Process tuning"): Arrow's C++
    # default pool is chosen when pyarrow loads.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

import argparse
import cProfile
import ctypes
import json
import random
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import psycopg2
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake import delta
from pgcdc_dagster.lake.memory import use_returning_pool
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.delta_stats import growth, table_stats
from pgcdc_dagster.ops.upkeep import upkeep_table
from pgcdc_dagster.postgres.local_cluster import LocalCluster
from pgcdc_dagster.spark.session import build_session

TABLES = [f"t{i}" for i in range(10)]
DDL = "CREATE TABLE {t} (id bigint PRIMARY KEY, n int NOT NULL, name text, at timestamptz)"
FILL = ("INSERT INTO {t} SELECT g, (abs(hashint8(g)) %% 1000)::int, md5(g::text), "
        "timestamptz '2026-01-01' + g * interval '1 second' FROM generate_series(1, %s) g")


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _tree_cpu(roots: set[int]) -> float:
    """CPU seconds (user + system) of the live processes under ``roots``, roots included,
    with their exited and reaped children's (``cutime``/``cstime``: a backend of a
    connection closed during the run, an autovacuum worker)."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        ticks[int(entry)] = sum(int(f) for f in fields[11:15])
    inside = set(roots)
    changed = True
    while changed:
        grown = {pid for pid, ppid in parents.items() if ppid in inside} - inside
        changed = bool(grown)
        inside |= grown
    return sum(ticks.get(pid, 0) for pid in inside) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process alone (not Spark's JVM)."""
    times = os.times()
    return times.user + times.system


def cpu_s(cluster: LocalCluster) -> tuple[float, float]:
    """CPU seconds used so far by this process and its children (Spark's JVM), and by
    PostgreSQL (the postmaster and its processes: logical decoding, but also autovacuum of
    the source tables): the run's work, whatever the machine's load (wall time is not, on a
    shared machine)."""
    try:
        postmaster = int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _tree_cpu({os.getpid()}), 0.0
    return _tree_cpu({os.getpid()}), _tree_cpu({postmaster})


def ratio(values: list[float], tenth: int) -> float:
    """Median of the last ``tenth`` values over the median of the first ``tenth``."""
    return statistics.median(values[-tenth:]) / max(statistics.median(values[:tenth]), 1e-9)


def slot_lag(cur: psycopg2.extensions.cursor, slot: str) -> int:
    cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) "
                "FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    row = cur.fetchone()
    return int(row[0] or 0) if row else 0


def duckdb_read_s(uri: str) -> float:
    files = DeltaTable(uri).file_uris()
    started = time.perf_counter()
    duckdb.sql("SELECT count(*), sum(n), max(name) FROM read_parquet($f) WHERE NOT __deleted",
               params={"f": files}).fetchall()
    return time.perf_counter() - started


def log_kb(uri: str) -> float:
    """KB of log a reader opening the table reads: the latest checkpoint and the JSON
    commits after it (a growing figure means every open replays more)."""
    log = Path(uri) / "_delta_log"
    try:
        last = int(json.loads((log / "_last_checkpoint").read_text())["version"])
    except (OSError, ValueError, KeyError):
        last = -1
    total = 0
    for f in log.iterdir():
        stem = f.name.split(".")[0]
        if not stem.isdigit():
            continue
        version = int(stem)
        if (version == last and ".checkpoint" in f.name) or \
                (version > last and f.name.endswith(".json")):
            total += f.stat().st_size
    return total / 1024


def arrow_pools() -> list[pa.MemoryPool]:
    """Every Arrow memory pool of the process: the Python default is not necessarily the
    C++ code's (``pa.set_memory_pool`` changes only the former)."""
    pools = [pa.default_memory_pool()]
    for make in (pa.mimalloc_memory_pool, pa.jemalloc_memory_pool, pa.system_memory_pool):
        try:
            pool = make()
        except NotImplementedError:
            continue
        if pool.backend_name not in {p.backend_name for p in pools}:
            pools.append(pool)
    return pools


class _Opens:
    """Delta table opens (log replays) of the project's code and their thread CPU time."""

    count = 0
    cpu_s = 0.0
    lock = threading.Lock()


class _CountedTable(DeltaTable):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        started = time.thread_time()
        super().__init__(*args, **kwargs)
        with _Opens.lock:
            _Opens.count += 1
            _Opens.cpu_s += time.thread_time() - started


def write_mix(cur: psycopg2.extensions.cursor, rng: random.Random, top: dict[str, int],
              large: str, large_scale: int) -> None:
    """One run's writes: random updates, updates of the newest keys, inserts, deletes."""
    for t in TABLES:
        scale = large_scale if t == large else 1
        hi = top[t]
        cur.execute(f"UPDATE {t} SET n = n + 1, name = md5(random()::text) WHERE id = ANY(%s)",
                    (rng.sample(range(1, hi), 10 * scale),))
        cur.execute(f"UPDATE {t} SET n = n + 1 WHERE id = ANY(%s)",
                    (rng.sample(range(max(1, hi - hi // 100), hi), 5 * scale),))
        cur.execute(f"INSERT INTO {t} SELECT g, 0, 'new', now() FROM generate_series(%s, %s) g",
                    (hi + 1, hi + 5 * scale))
        top[t] = hi + 5 * scale
        cur.execute(f"DELETE FROM {t} WHERE id = ANY(%s)", (rng.sample(range(1, hi), 2 * scale),))


def layer_stats(root: str, layer: str) -> dict[str, object]:
    return {t: table_stats(table_uri(root, layer, "public", t)) for t in TABLES}


def converged(cur: psycopg2.extensions.cursor, root: str) -> list[str]:
    """Tables whose silver (live id, n) differs from the source."""
    bad = []
    for t in TABLES:
        cur.execute(f"SELECT id, n FROM {t}")
        source = set(cur.fetchall())
        data = DeltaTable(table_uri(root, "silver", "public", t)).to_pyarrow_table(
            columns=["id", "n", "__deleted"])
        live = data.filter(pc.invert(data["__deleted"]))
        if source != set(zip(live["id"].to_pylist(), live["n"].to_pylist(), strict=True)):
            bad.append(t)
    return bad


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--upkeep-every", type=int, default=10)
    parser.add_argument("--large-rows", type=int, default=1_000_000)
    parser.add_argument("--small-rows", type=int, default=20_000)
    parser.add_argument("--target-file-bytes", type=int, default=1 << 20)
    parser.add_argument("--large-scale", type=int, default=10,
                        help="the large table's writes per run, times the small tables' "
                             "(10 random updates, 5 newest, 5 inserts, 2 deletes)")
    parser.add_argument("--csv", help="also write the per-run figures to this CSV file")
    parser.add_argument("--malloc-trim", action="store_true",
                        help="after each run, return freed memory to the OS (glibc "
                             "malloc_trim, Arrow's pool) before RSS is measured")
    parser.add_argument("--profile", help="write cProfile stats of the first and last 10 %% "
                                          "of runs' micro-batches to PROFILE-first/-last")
    parser.add_argument("--arrow-pool", choices=("deployed", "default"), default="deployed",
                        help="Arrow's memory pools: the ones the Dagster code location sets "
                             "(jemalloc for Arrow's C++ code, ARROW_DEFAULT_MEMORY_POOL, and "
                             "for Python's calls, returning freed pages: lake/memory.py), or "
                             "pyarrow's defaults (mimalloc)")
    args = parser.parse_args()
    delta.DeltaTable = _CountedTable  # type: ignore[misc]  # every open of the project's code
    if args.arrow_pool == "deployed":
        use_returning_pool()
    print(f"Arrow memory pool: {pa.default_memory_pool().backend_name}")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = Path(tempfile.mkdtemp(prefix="pgcdc-bench-soak-"))
    cluster = LocalCluster(root / "pg").start()
    try:
        conn = psycopg2.connect(cluster.dsn)
        conn.autocommit = True
        cur = conn.cursor()
        top = {}
        for t in TABLES:
            rows = args.large_rows if t == "t0" else args.small_rows
            cur.execute(DDL.format(t=t))
            cur.execute(FILL.format(t=t), (rows,))
            top[t] = rows
        cur.execute("VACUUM ANALYZE")
        lake = str(root / "lake")
        settings = CaptureSettings(dsn=cluster.dsn, lakehouse=lake, slot="soak",
                                   publication="soak", include=("public\\.t[0-9]",),
                                   target_file_bytes=args.target_file_bytes)
        spark = build_session()
        started = time.perf_counter()
        run_bronze(settings, spark, force_snapshot_step=True)
        run_silver(settings, spark)
        print(f"load average at start: {os.getloadavg()}")
        print(f"snapshot of {len(TABLES)} tables ({args.large_rows:,} + 9 x "
              f"{args.small_rows:,} rows): {time.perf_counter() - started:.1f} s")
        large = table_uri(lake, "silver", "public", "t0")
        rng = random.Random(17)
        seconds: list[float] = []
        cpu: list[float] = []
        cpu_ours: list[float] = []
        cpu_pg: list[float] = []
        cpu_own: list[float] = []
        loads: list[float] = []
        reads: list[float] = []
        after_upkeep: list[float] = []
        silver_files: list[int] = []
        print("run  seconds  cpu_s  bronze_MB  silver_MB  max_files(b/s)  rss_MB  arrow_MB  "
              "slot_lag_B  duckdb_s  log_KB(b/s)  opens(ms)  load1  upkeep")
        log = open(args.csv, "w", encoding="utf-8") if args.csv else None
        if log:
            log.write("run,seconds,cpu_s,cpu_ours_s,cpu_python_s,cpu_pg_s,bronze_bytes,silver_bytes,bronze_files,silver_files,"
                      "rss_mb,arrow_mb,slot_lag_bytes,duckdb_s,bronze_log_kb,silver_log_kb,opens,"
                      "opens_cpu_ms,load1,"
                      "upkeep_s,upkeep_bytes\n")
        profiler = cProfile.Profile()
        for run in range(1, args.runs + 1):
            write_mix(cur, rng, top, "t0", args.large_scale)
            before = {layer: layer_stats(lake, layer) for layer in ("bronze", "silver")}
            tenth = max(1, args.runs // 10)
            profiled = args.profile and (run <= tenth or run > args.runs - tenth)
            if profiled:
                profiler.enable()
            started, cpu_started, own_started = time.perf_counter(), cpu_s(cluster), own_cpu_s()
            opens = (_Opens.count, _Opens.cpu_s)
            run_bronze(settings, spark, force_snapshot_step=False)
            run_silver(settings, spark)
            if profiled:
                profiler.disable()
                if run in (tenth, args.runs):
                    name = "first" if run == tenth else "last"
                    profiler.dump_stats(f"{args.profile}-{name}")
                    profiler = cProfile.Profile()
            seconds.append(time.perf_counter() - started)
            cpu_now = cpu_s(cluster)
            cpu_own.append(own_cpu_s() - own_started)
            cpu_ours.append(cpu_now[0] - cpu_started[0])
            cpu_pg.append(cpu_now[1] - cpu_started[1])
            cpu.append(cpu_ours[-1] + cpu_pg[-1])
            opened = (_Opens.count - opens[0], (_Opens.cpu_s - opens[1]) * 1000)
            after = {layer: layer_stats(lake, layer) for layer in ("bronze", "silver")}
            written = {layer: sum(growth(before[layer][t], after[layer][t],  # type: ignore[arg-type]
                                         table_uri(lake, layer, "public", t)).bytes
                                  for t in TABLES) for layer in after}
            files = {layer: max(s.files for s in after[layer].values())  # type: ignore[attr-defined]
                     for layer in after}
            note, u_seconds, rewritten = "", 0.0, 0
            if run % args.upkeep_every == 0:
                u_started = time.perf_counter()
                rewritten = sum(layer.compaction.bytes_added for t in TABLES
                                for layer in upkeep_table(lake, "public", t,
                                                          app_prefix=settings.app_prefix,
                                                          target_bytes=args.target_file_bytes,
                                                          retention_hours=168))
                u_seconds = time.perf_counter() - u_started
                note = f"{u_seconds:.1f} s, {rewritten / 1e6:.1f} MB"
                after_upkeep.append(duckdb_read_s(large))
            reads.append(duckdb_read_s(large))
            silver_files.append(files["silver"])
            if args.malloc_trim:
                ctypes.CDLL("libc.so.6").malloc_trim(0)
                for pool in arrow_pools():
                    pool.release_unused()
            load1, lag, rss = os.getloadavg()[0], slot_lag(cur, "soak"), rss_mb()
            loads.append(load1)
            arrow = sum(pool.bytes_allocated() for pool in arrow_pools()) / 1e6
            logs = {layer: log_kb(table_uri(lake, layer, "public", "t0"))
                    for layer in ("bronze", "silver")}
            print(f"{run:3d}  {seconds[-1]:7.2f}  {cpu[-1]:5.2f}  {written['bronze'] / 1e6:9.2f}  "
                  f"{written['silver'] / 1e6:9.2f}  {files['bronze']:5d}/{files['silver']:<5d}  "
                  f"{rss:7.0f}  {arrow:8.1f}  {lag:10d}  {reads[-1]:8.3f}  "
                  f"{logs['bronze']:5.0f}/{logs['silver']:<5.0f}  "
                  f"{opened[0]:4d}({opened[1]:4.0f})  {load1:5.2f}  {note}",
                  flush=True)
            if log:
                log.write(f"{run},{seconds[-1]:.3f},{cpu[-1]:.3f},{cpu_ours[-1]:.3f},"
                          f"{cpu_own[-1]:.3f},"
                          f"{cpu_pg[-1]:.3f},{written['bronze']},"
                          f"{written['silver']},{files['bronze']},{files['silver']},{rss:.0f},"
                          f"{arrow:.1f},{lag},{reads[-1]:.4f},{logs['bronze']:.1f},{logs['silver']:.1f},"
                          f"{opened[0]},{opened[1]:.1f},"
                          f"{load1:.2f},{u_seconds:.2f},"
                          f"{rewritten}\n")
                log.flush()
        if log:
            log.close()
        run_bronze(settings, spark, force_snapshot_step=False)
        run_silver(settings, spark)
        bad = converged(cur, lake)
        print(f"convergence: {'every silver table equals its source' if not bad else bad}")
        tenth = max(1, args.runs // 10)
        first, last = statistics.median(seconds[:tenth]), statistics.median(seconds[-tenth:])
        size = table_stats(large).bytes
        bound = size // args.target_file_bytes + 2 * args.upkeep_every + 10
        c_first, c_last = statistics.median(cpu[:tenth]), statistics.median(cpu[-tenth:])
        l_first = statistics.median(loads[:tenth])
        l_last = statistics.median(loads[-tenth:])
        print(f"ratio last/first 10 % of runs (seconds, medians): {last / first:.2f} "
              f"(target <= 1.2; load average {l_first:.1f} -> {l_last:.1f})")
        print(f"ratio last/first 10 % of runs (CPU seconds of this process, Spark's JVM and "
              f"PostgreSQL, medians): {c_last / c_first:.2f} (this process and Spark "
              f"{ratio(cpu_ours, tenth):.2f}, of which this process {ratio(cpu_own, tenth):.2f}; "
              f"PostgreSQL {ratio(cpu_pg, tenth):.2f})")
        print(f"most files in a silver table: {max(silver_files)} (bound {bound}: large "
              f"table {size / 1e6:.0f} MB / target + 2 x runs between upkeeps + 10)")
        if after_upkeep:
            print(f"ratio DuckDB read / read right after compaction (medians): "
                  f"{statistics.median(reads) / statistics.median(after_upkeep):.2f} "
                  "(target <= 1.2)")
        spark.stop()
        conn.close()
        if bad:
            raise SystemExit(f"silver differs from the source: {bad}")
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
