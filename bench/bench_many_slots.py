"""Many slots, one lakehouse: two captures at once against one.

A throwaway PostgreSQL with two tables, ``orders`` and ``events``, and three captures:

* ``one``: one slot and publication over both tables, into its own lakehouse;
* ``a`` and ``b``: a slot and publication each, ``a`` over ``orders`` and ``b`` over
  ``events``, both into one shared lakehouse (disjoint tables, the shared
  ``bronze/_pgcdc/schema_history``) — the split that docs/operations.md, "Many slots, one
  lakehouse", describes.

Each round commits the same number of changes to both tables (inserts, then updates), then
catches up (peek -> bronze -> silver -> advance, every window) ``one`` alone and ``a`` + ``b``
at the same time, in alternating order. Every capture runs in a process of its own, as in
its own code location; the processes start and import first and are timed from a common
"go". Printed per round: the seconds of ``one``, of the split (the later of ``a`` and ``b``)
and their ratio, each capture process's CPU seconds, and the raw server-side peek of each
slot (PostgreSQL decodes the whole WAL for every slot; the publication only filters what it
sends), with the load average (the machine is shared: compare ratios, not rates).

    .venv/bin/python -m bench.bench_many_slots [--changes 800000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg2

from bench.bench_stream import generate, raw_peek
from pgcdc_dagster.postgres.local_cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]
CAPTURES = {"one": r"public\.(orders|events)", "a": r"public\.orders", "b": r"public\.events"}
TABLES = """
CREATE TABLE orders (id bigint PRIMARY KEY, customer int, status text, amount numeric(12,2),
                     updated timestamptz);
CREATE TABLE events (id bigint PRIMARY KEY, kind text, payload text, at timestamptz);
"""


def worker(dsn: str, lake: str, slot: str, include: str, mode: str) -> None:
    """One capture in this process: ``snapshot`` once, or ``stream``: wait for a line on
    stdin, catch up, print ``DONE`` with seconds, events and CPU seconds as JSON."""
    from pgcdc_dagster.capture.runner import run_bronze, run_silver
    from pgcdc_dagster.capture.settings import CaptureSettings
    from pgcdc_dagster.spark.lazy import LazySpark
    from pgcdc_dagster.spark.session import open_session

    settings = CaptureSettings(dsn=dsn, lakehouse=lake, include=(include,), slot=slot,
                               publication=slot, max_windows=10_000)
    spark = LazySpark(open_session, "local[2]")  # never started: no Spark work here
    if mode == "snapshot":
        run_bronze(settings, spark, force_snapshot_step=True)
        run_silver(settings, spark)
        return
    print("READY", flush=True)
    sys.stdin.readline()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    report = run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert report.stream is not None
    events = sum(sum(o.values()) for o in report.stream.events_by_table().values())
    print("DONE " + json.dumps({"seconds": seconds, "events": events, "cpu": (
        after.ru_utime - cpu.ru_utime + after.ru_stime - cpu.ru_stime)}), flush=True)


def _spawn(dsn: str, lake: Path, slot: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.bench_many_slots", "--worker", dsn, str(lake), slot,
         CAPTURES[slot], mode], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def catch_up(dsn: str, lakes: dict[str, Path], slots: list[str]) -> tuple[float, dict[str, Any]]:
    """Start one process per slot, let them import, then time them from a common start."""
    procs = {slot: _spawn(dsn, lakes[slot], slot, "stream") for slot in slots}
    for slot, proc in procs.items():
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY", slot
    started = time.perf_counter()
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results, finished = {}, started
    for slot, proc in procs.items():  # the last DONE read is the last capture's end
        assert proc.stdout is not None
        line = proc.stdout.readline()
        finished = time.perf_counter()
        if not line.startswith("DONE "):
            proc.wait()
            sys.exit(f"capture {slot} failed")
        results[slot] = json.loads(line[len("DONE "):])
    for slot, proc in procs.items():
        if proc.wait() != 0:
            sys.exit(f"capture {slot} failed")
    return finished - started, results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=800_000,
                        help="changes per round across both tables")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", nargs=5, metavar=("DSN", "LAKE", "SLOT", "INCLUDE", "MODE"))
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    root = Path(tempfile.mkdtemp(prefix="pgcdc-bench-many-slots-"))
    cluster = LocalCluster(root / "pg").start()
    try:
        conn = psycopg2.connect(cluster.dsn)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute(TABLES)
        lakes = {"one": root / "lake_one", "a": root / "lake_split", "b": root / "lake_split"}
        for slot in CAPTURES:  # the slots and empty tables: every later change is streamed
            proc = _spawn(cluster.dsn, lakes[slot], slot, "snapshot")
            proc.communicate()
            assert proc.returncode == 0, slot
        per = args.changes // 4
        ratios = []
        for round_no in range(args.repeat):
            generate(cur, per, round_no * per)
            peeks = {}
            for slot in CAPTURES:
                raw_peek(cluster.dsn, slot, slot)  # warm
                peeks[slot] = raw_peek(cluster.dsn, slot, slot)
            load = os.getloadavg()[0]
            order = [["one"], ["a", "b"]] if round_no % 2 == 0 else [["a", "b"], ["one"]]
            timed = {}
            for slots in order:
                timed[",".join(slots)] = catch_up(cluster.dsn, lakes, slots)
            one_s, one = timed["one"]
            split_s, split = timed["a,b"]
            assert one["one"]["events"] == split["a"]["events"] + split["b"]["events"] == \
                per * 4, (one, split)
            ratios.append(split_s / one_s)
            print(f"round {round_no + 1} (load {load:.1f}, {per * 4:,} changes, "
                  f"{'one first' if round_no % 2 == 0 else 'split first'}):")
            print(f"  one capture of both tables: {one_s:.1f} s "
                  f"({per * 4 / one_s:,.0f} changes/s), CPU {one['one']['cpu']:.1f} s")
            print(f"  two captures at once:       {split_s:.1f} s "
                  f"({per * 4 / split_s:,.0f} changes/s); a {split['a']['seconds']:.1f} s "
                  f"CPU {split['a']['cpu']:.1f} s, b {split['b']['seconds']:.1f} s "
                  f"CPU {split['b']['cpu']:.1f} s")
            print(f"  ratio two/one: {split_s / one_s:.2f}")
            print("  raw peek of each slot (server-side decode of the same WAL): " + ", ".join(
                f"{slot} {rows:,} rows {secs:.2f} s" for slot, (rows, secs) in peeks.items()))
        print(f"ratio two captures / one over {args.repeat} rounds: best {min(ratios):.2f}, "
              f"median {statistics.median(ratios):.2f}; {os.cpu_count()} CPUs")
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
