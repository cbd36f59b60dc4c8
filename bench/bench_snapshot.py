"""Initial-snapshot benchmark: our end-to-end rate against raw COPY on the same tables.

Prints the raw ``COPY (SELECT ...) TO STDOUT (FORMAT binary)`` rate of the tables (PostgreSQL
alone, into a byte-counting sink: the limit), our rate from PostgreSQL to committed bronze
and silver Delta tables (``run_snapshot``: new slot with an exported snapshot, key-range
chunks read by Spark tasks, Parquet, delta-rs commits), and their ratio (issue 5 target:
>= 0.5). Each measurement is repeated (``--repeat``) and the best is kept, raw and ours
alternately, so both see the same machine load; the first snapshot of a fresh Spark session
(Python workers starting) is reported apart.

    .venv/bin/python bench/bench_snapshot.py [--rows 2000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psycopg2

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import run_snapshot
from pgcdc_dagster.postgres.local_cluster import LocalCluster
from pgcdc_dagster.spark.session import build_session

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


class Sink:
    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self.bytes += len(data)
        return len(data)


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


def snapshot_seconds(dsn: str, root: Path, name: str, spark: object) -> tuple[float, int]:
    settings = CaptureSettings(dsn=dsn, lakehouse=str(root / name), slot=name,
                               publication=name, include=("public\\.(orders|metrics)",))
    started = time.perf_counter()
    report = run_snapshot(settings, spark, force=True,  # type: ignore[arg-type]
                          progress=lambda _line: None)
    elapsed = time.perf_counter() - started
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    conn.close()
    return elapsed, report.rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows across all tables")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = Path(tempfile.mkdtemp(prefix="pgcdc-bench-snap-"))
    cluster = LocalCluster(root / "pg").start()
    try:
        conn = psycopg2.connect(cluster.dsn)
        conn.autocommit = True
        per_table = args.rows // len(TABLES)
        with conn.cursor() as cur:
            for name, ddl in TABLES.items():
                cur.execute(ddl)
                cur.execute(FILL[name] % per_table)
            cur.execute("VACUUM ANALYZE")
        conn.close()
        total = per_table * len(TABLES)
        spark = build_session()
        spark.range(10).count()  # the JVM's start-up is not snapshot work
        raw_copy_seconds(cluster.dsn, list(TABLES))  # warm the cache
        cold, rows = snapshot_seconds(cluster.dsn, root, "cold", spark)
        assert rows == total, (rows, total)
        raw_s, ours_s = float("inf"), float("inf")
        raw_bytes = 0
        for i in range(args.repeat):
            elapsed, raw_bytes = raw_copy_seconds(cluster.dsn, list(TABLES))
            raw_s = min(raw_s, elapsed)
            elapsed, rows = snapshot_seconds(cluster.dsn, root, f"warm{i}", spark)
            assert rows == total, (rows, total)
            ours_s = min(ours_s, elapsed)
        raw, ours = total / raw_s, total / ours_s
        print(f"rows: {total:,} in {len(TABLES)} tables ({raw_bytes / 1e6:.0f} MB as COPY binary)")
        print(f"raw COPY binary (limit): {raw:,.0f} rows/s ({raw_s:.2f} s)")
        print(f"pgcdc snapshot to committed bronze+silver: {ours:,.0f} rows/s ({ours_s:.2f} s); "
              f"first in a fresh Spark session: {total / cold:,.0f} rows/s ({cold:.2f} s)")
        print(f"ratio: {ours / raw:.2f}")
        spark.stop()
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
