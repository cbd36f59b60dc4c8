"""Peak memory of a micro-batch against the size of the transaction it carries.

For each size N (``--rows``), on a cluster of its own: a database with an empty table,
its slot created by a first micro-batch, then ONE transaction inserting N rows of about
100 bytes, then one micro-batch process (bronze and silver, no Spark: silver batches stay
below the Spark threshold) whose peak RSS (``wait4``'s ``ru_maxrss``) is printed, with the
ratio of each peak to the smallest transaction's. Target: a 2M-row transaction within 1.5x
of a 200k-row one (memory follows the window portions and silver batches, not the
transaction).

    .venv/bin/python bench/bench_txn_memory.py [--rows 200000 2000000] [--batch-rows N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg2

from pgcdc_dagster.postgres.local_cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]


def _child(dsn: str, lake: str, slot: str, batch_rows: int | None,
           mode: str = "arrow-silver") -> tuple[float, int]:
    """Run one micro-batch process; its wall seconds and peak RSS (bytes)."""
    args = [sys.executable, "-m", "tests.support.crash_runner", dsn, lake, slot, mode]
    if batch_rows:
        args.append(f"silver-batch-rows={batch_rows}")
    started = time.monotonic()
    proc = subprocess.Popen(args, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    if status != 0:
        raise SystemExit(f"micro-batch failed: {proc.stderr.read()[-3000:] if proc.stderr else ''}")
    return seconds, usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[200_000, 2_000_000])
    parser.add_argument("--batch-rows", type=int, default=0)
    opts = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pgcdc-txn-mem-"))
    cluster = LocalCluster(root / "pg").start()
    peaks: list[tuple[int, int, float]] = []
    try:
        for n in opts.rows:
            db = f"mem{n}"
            admin = psycopg2.connect(cluster.dsn)
            admin.autocommit = True
            with admin.cursor() as cur:
                cur.execute(f"CREATE DATABASE {db}")
            admin.close()
            dsn = cluster.dsn.replace("dbname=postgres", f"dbname={db}")
            lake = str(root / f"lake{n}")
            conn = psycopg2.connect(dsn)
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("CREATE TABLE t (id bigint PRIMARY KEY, a int, b text)")
            _child(dsn, lake, db, opts.batch_rows, "silver")  # slot, empty snapshot (Spark)
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO t SELECT g, g % 1000, repeat(md5(g::text), 2) "
                            f"FROM generate_series(1, {n}) g")
                cur.execute("SELECT pg_current_wal_lsn() - confirmed_flush_lsn "
                            "FROM pg_replication_slots WHERE slot_name = %s", (db,))
                wal = int(cur.fetchone()[0])
            conn.close()
            seconds, peak = _child(dsn, lake, db, opts.batch_rows)
            peaks.append((n, peak, seconds))
            print(f"{n:>9} rows in one transaction ({wal / 2**20:.0f} MiB WAL): micro-batch "
                  f"peak RSS {peak / 2**20:.0f} MiB, {seconds:.0f} s, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
        base = peaks[0][1]
        for n, peak, _ in peaks[1:]:
            print(f"peak RSS ratio {n} / {peaks[0][0]} rows: {peak / base:.2f} (target <= 1.5)")
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
