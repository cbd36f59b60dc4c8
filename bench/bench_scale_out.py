"""Scale-out benchmark: snapshot to object storage against local disk, and a Spark
standalone cluster (two workers) against ``local[2]``, as ratios in one run.

Starts a throwaway PostgreSQL, a local S3-compatible server (moto, loopback; the test
support's) and a standalone cluster with pyspark's own launcher (master + two workers of one
core each, all on loopback), then snapshots the same tables four ways, ``--repeat`` times
each, alternating so every variant sees the same machine load:

* ``local[2]`` into a local lakehouse and into ``s3://``;
* the cluster (``spark://``) into a local lakehouse and into ``s3://``.

It prints the best and median seconds of each and the ratios ``s3 / disk`` (object storage's
cost; here a loopback moto server, whose Python request handling is the bottleneck, not a
real store) and ``cluster / local[2]`` (on one machine both share the same cores: the ratio
shows the cluster path works without a penalty, not the speed-up of more hosts).

    .venv/bin/python bench/bench_scale_out.py [--rows 400000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg2

from bench.bench_snapshot import TABLES, fill_tables
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import run_snapshot
from pgcdc_dagster.postgres.local_cluster import LocalCluster
from pgcdc_dagster.spark.session import build_session
from tests.support import s3_server, spark_cluster


def snapshot_seconds(dsn: str, lakehouse: str, spark: object) -> float:
    name = f"b{uuid.uuid4().hex[:10]}"
    settings = CaptureSettings(dsn=dsn, lakehouse=lakehouse, slot=name, publication=name,
                               include=("public\\.(orders|metrics)",))
    started = time.perf_counter()
    run_snapshot(settings, spark, force=True, progress=lambda _line: None)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    conn.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400_000, help="rows across all tables")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = Path(tempfile.mkdtemp(prefix="pgcdc-bench-scale-out-"))
    started: list[Any] = []  # stopped in reverse order, whatever fails
    try:
        pg = LocalCluster(root / "pg").start()
        started.append(pg)
        store = s3_server.start()
        started.append(store)
        cluster = spark_cluster.start(workers=2)
        started.append(cluster)
        os.environ.update(store.env())
        bucket = "bench"
        store.create_bucket(bucket)
        per_table = fill_tables(pg.dsn, args.rows)
        times: dict[str, list[float]] = {}
        for master in ("local[2]", cluster.master):
            spark = build_session(master, "pgcdc-bench-scale-out")
            spark.range(10).count()  # JVM and executors up: not snapshot work
            snapshot_seconds(pg.dsn, str(root / "warm"), spark)  # Python workers started
            where = "local2" if master.startswith("local") else "cluster"
            for i in range(args.repeat):
                for lake, kind in ((str(root / f"{where}-{i}"), "disk"),
                                   (f"s3://{bucket}/{where}-{i}", "s3")):
                    times.setdefault(f"{where}/{kind}", []).append(
                        snapshot_seconds(pg.dsn, lake, spark))
            spark.stop()
        total = per_table * len(TABLES)
        print(f"rows: {total:,} in {len(TABLES)} tables; {os.cpu_count()} CPUs, load "
              f"{os.getloadavg()[0]:.1f}")
        for key, values in times.items():
            print(f"{key:>16}: best {min(values):.2f} s, median {statistics.median(values):.2f} s"
                  f" ({total / min(values):,.0f} rows/s)")
        best = {k: min(v) for k, v in times.items()}
        print(f"ratio s3/disk, local[2]: {best['local2/s3'] / best['local2/disk']:.2f}")
        print(f"ratio s3/disk, cluster: {best['cluster/s3'] / best['cluster/disk']:.2f}")
        print(f"ratio cluster/local[2], disk: "
              f"{best['cluster/disk'] / best['local2/disk']:.2f}")
        print(f"ratio cluster/local[2], s3: {best['cluster/s3'] / best['local2/s3']:.2f}")
    finally:
        for service in reversed(started):
            service.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
