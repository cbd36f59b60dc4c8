"""Silver write amplification: bytes a micro-batch writes against the table's bytes.

A table of ``--rows`` rows is snapshotted (real PostgreSQL, the project's snapshot), silver's
snapshot chunk files are split into clustered files of the target size by one upkeep
compaction, then micro-batches (bronze + silver, the project's runner) apply ``--updates``
updates among the newest 1 % of keys, then ``--updates`` updates to random keys. For each,
the bytes the silver commits added and removed are read from the Delta log and printed as a
ratio of the table's bytes, with the bytes per row of the files written against the
snapshot's. Targets: newest 1 % <= 2 %, random <= 25 %, bytes per row within
+-20 % of the snapshot's. Also reads silver back with DuckDB (the Parquet files delta-rs
lists) and checks the row count.

``--key`` picks the primary key's type: ``bigint`` (the row number), ``text`` (``item-`` and
the zero-padded row number: ordered like the rows) or ``uuid`` (``md5`` of the row number:
random, so the newest rows' keys are spread over the whole key range, like
``gen_random_uuid()`` keys; there is no "newest" locality to exploit) or ``uuid7`` (the row
number in the leading 48 bits, like UUIDv7's timestamp: time-ordered).

    .venv/bin/python bench/bench_silver_merge.py [--rows 2000000] [--updates 100]
        [--target-file-bytes 1048576] [--key bigint|text|uuid|uuid7]
        # --rows 20000000 for the target scale
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psycopg2
import pyarrow as pa
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.upkeep import CompactionResult, compact
from pgcdc_dagster.postgres.local_cluster import LocalCluster
from pgcdc_dagster.spark.session import build_session

KEYS = {"bigint": ("bigint", "g"), "text": ("text", "'item-' || lpad(g::text, 12, '0')"),
        "uuid": ("uuid", "md5(g::text)::uuid"),
        "uuid7": ("uuid", "(lpad(to_hex(g), 12, '0') || '7' || left(md5(g::text), 19))::uuid")}
"""Key type and its value for row number ``g``."""
DDL = ("CREATE TABLE items (id {type} NOT NULL, name text NOT NULL, qty int NOT NULL, "
       "price numeric(12,2) NOT NULL, note text, updated_at timestamptz NOT NULL)")
FILL = ("INSERT INTO items SELECT {key}, 'item ' || left(md5(g::text), 12), "
        "(abs(hashint8(g)) %% 1000)::int, (abs(hashint8(g * 7)) %% 10000000) / 100.0, "
        "CASE WHEN g %% 3 = 0 THEN md5((g * 3)::text) END, "
        "timestamptz '2026-01-01' + (abs(hashint8(g * 11)) %% 31536000) * interval '1 second' "
        "FROM generate_series(1, %s) g")


def table_bytes(uri: str) -> tuple[int, int, int]:
    """Files, bytes and rows of the table now."""
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    return len(adds), sum(a["size_bytes"] for a in adds), sum(a["num_records"] for a in adds)


def log_delta(uri: str, since: int) -> dict[str, int]:
    """Added/removed files, bytes and rows of the commits after version ``since``."""
    out = {"added_files": 0, "added_bytes": 0, "added_rows": 0, "removed_files": 0,
           "removed_bytes": 0}
    for version in range(since + 1, DeltaTable(uri).version() + 1):
        with open(os.path.join(uri, "_delta_log", f"{version:020d}.json"),
                  encoding="utf-8") as fh:
            for line in fh:
                action = json.loads(line)
                if "add" in action:
                    out["added_files"] += 1
                    out["added_bytes"] += action["add"]["size"]
                    out["added_rows"] += json.loads(action["add"]["stats"])["numRecords"]
                elif "remove" in action:
                    out["removed_files"] += 1
                    out["removed_bytes"] += action["remove"].get("size", 0)
    return out


def batch(cur: psycopg2.extensions.cursor, settings: CaptureSettings, spark: object,
          uri: str, keys: list[int], label: str, snapshot_bpr: float, key: str
          ) -> tuple[float, float]:
    """Update the rows numbered ``keys`` and run a micro-batch."""
    files, size, _ = table_bytes(uri)
    since = DeltaTable(uri).version()
    cur.execute("UPDATE items SET qty = qty + 1, note = 'changed' WHERE id IN "
                f"(SELECT {KEYS[key][1]} FROM unnest(%s::bigint[]) g)", (keys,))
    started = time.perf_counter()
    run_bronze(settings, spark, force_snapshot_step=False)  # type: ignore[arg-type]
    run_silver(settings, spark)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    d = log_delta(uri, since)
    ratio = d["added_bytes"] / size
    bpr = d["added_bytes"] / max(d["added_rows"], 1)
    print(f"{label}: {len(keys)} updates -> silver wrote {d['added_bytes'] / 1e6:.2f} MB in "
          f"{d['added_files']} files, removed {d['removed_files']} of {files} files "
          f"({d['removed_bytes'] / 1e6:.2f} MB) of a {size / 1e6:.1f} MB table; "
          f"bytes written / table bytes = {ratio:.4f} ({ratio * 100:.2f} %); "
          f"bytes per row written {bpr:.2f} = {bpr / snapshot_bpr:.2f} x the snapshot's; "
          f"micro-batch {elapsed:.2f} s")
    return ratio, bpr / snapshot_bpr


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--target-file-bytes", type=int, default=1 << 20)
    parser.add_argument("--key", choices=sorted(KEYS), default="bigint")
    parser.add_argument("--skip-compaction", action="store_true",
                        help="merge into the snapshot's chunk files as they are (the first "
                             "micro-batches before any upkeep)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = Path(tempfile.mkdtemp(prefix="pgcdc-bench-silver-"))
    cluster = LocalCluster(root / "pg").start()
    try:
        conn = psycopg2.connect(cluster.dsn)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute(DDL.format(type=KEYS[args.key][0]))
        cur.execute(FILL.format(key=KEYS[args.key][1]) % args.rows)
        cur.execute("ALTER TABLE items ADD PRIMARY KEY (id)")  # one sorted build: random keys
        cur.execute("VACUUM ANALYZE items")
        settings = CaptureSettings(dsn=cluster.dsn, lakehouse=str(root / "lake"), slot="bench",
                                   publication="bench", include=("public\\.items",),
                                   target_file_bytes=args.target_file_bytes)
        spark = build_session()
        started = time.perf_counter()
        run_bronze(settings, spark, force_snapshot_step=True)
        run_silver(settings, spark)
        uri = table_uri(settings.lakehouse, "silver", "public", "items")
        files, size, rows = table_bytes(uri)
        assert rows == args.rows, (rows, args.rows)
        snapshot_bpr = size / rows
        print(f"snapshot ({args.key} key): {rows:,} rows, silver {files} files, "
              f"{size / 1e6:.1f} MB, {snapshot_bpr:.2f} bytes/row "
              f"({time.perf_counter() - started:.1f} s)")
        print("snapshot silver file sizes (MB): "
              + ", ".join(f"{a['size_bytes'] / 1e6:.1f}" for a in pa.table(
                  DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()))
        started = time.perf_counter()
        result = compact(uri, ["id"], args.target_file_bytes) if not args.skip_compaction \
            else CompactionResult()
        files, size, _ = table_bytes(uri)
        print(f"upkeep compaction: split {result.files_removed} snapshot files into "
              f"{result.files_added} clustered files of ~{args.target_file_bytes >> 10} KiB "
              f"({size / rows:.2f} bytes/row; {time.perf_counter() - started:.1f} s)")
        rng = random.Random(17)
        newest = rng.sample(range(args.rows - args.rows // 100 + 1, args.rows + 1), args.updates)
        r_newest, b_newest = batch(cur, settings, spark, uri, newest, "newest 1 % of rows",
                                   snapshot_bpr, args.key)
        spread = rng.sample(range(1, args.rows + 1), args.updates)
        r_random, b_random = batch(cur, settings, spark, uri, spread, "random rows",
                                   snapshot_bpr, args.key)
        import duckdb  # only the bench reads with DuckDB

        started = time.perf_counter()
        count = duckdb.sql("SELECT count(*) FROM read_parquet($files) WHERE NOT __deleted",
                           params={"files": DeltaTable(uri).file_uris()}).fetchone()
        print(f"DuckDB read of silver: {count[0] if count else 0:,} live rows in "
              f"{time.perf_counter() - started:.2f} s")
        print(f"ratio newest 1 %: {r_newest:.4f} (target <= 0.02; before: 1.00-2.43)")
        print(f"ratio random: {r_random:.4f} (target <= 0.25; before: 2.43)")
        print(f"bytes per row written / snapshot's: newest {b_newest:.2f}, random "
              f"{b_random:.2f} (target 0.80-1.20; before: 2.4)")
        spark.stop()
        conn.close()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
