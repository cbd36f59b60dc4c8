"""The end-to-end demo: a throwaway PostgreSQL, live writes, snapshot, micro-batches, an
incremental snapshot, summary.

Run it with ``bash scripts/demo.sh`` (or ``python -m pgcdc_dagster.demo``). Everything lives
under ``.demo/`` in the working directory; each run starts from a fresh database and lakehouse.
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import psycopg2
import pyarrow.compute as pc

from pgcdc_dagster.lake.delta import load_table
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.postgres.local_cluster import LocalCluster

DEMO_DB = "pgcdc_demo"
SCHEMA_SQL = """
CREATE TABLE customers (
    id bigserial PRIMARY KEY, name text NOT NULL, email text, vip boolean DEFAULT false,
    created_at timestamptz DEFAULT now());
CREATE TABLE products (
    sku int PRIMARY KEY, title text NOT NULL, price numeric(10,2) NOT NULL, stock int NOT NULL);
CREATE TABLE orders (
    id bigserial PRIMARY KEY, customer_id bigint REFERENCES customers(id) ON DELETE CASCADE,
    sku int REFERENCES products(sku), quantity smallint NOT NULL, total numeric(12,2),
    placed_at timestamptz DEFAULT now(), note text);
INSERT INTO customers (name, email, vip)
    SELECT 'customer ' || g, 'c' || g || '@example.com', g % 10 = 0 FROM generate_series(1, 2000) g;
INSERT INTO products SELECT g, 'product ' || g, (g % 97) + 0.99, 100 FROM generate_series(1, 300) g;
INSERT INTO orders (customer_id, sku, quantity, total)
    SELECT 1 + g % 2000, 1 + g % 300, 1 + g % 5, (1 + g % 5) * ((1 + g % 300) % 97 + 0.99)
    FROM generate_series(1, 5000) g;
"""


def _admin_dsn(cluster: LocalCluster) -> str:
    return cluster.dsn


def prepare_database(cluster: LocalCluster) -> str:
    """(Re)create the demo database with its sample schema; return its DSN."""
    conn = psycopg2.connect(_admin_dsn(cluster))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = %s", (DEMO_DB,))
        cur.execute(f"DROP DATABASE IF EXISTS {DEMO_DB} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {DEMO_DB}")
    conn.close()
    dsn = f"{cluster.dsn.replace('dbname=postgres', '')} dbname={DEMO_DB}".strip()
    with psycopg2.connect(dsn) as demo, demo.cursor() as cur:
        cur.execute(SCHEMA_SQL)
    return dsn


def apply_workload(dsn: str, rng: random.Random, transactions: int) -> int:
    """Inserts, updates and deletes across the tables, several tables per transaction."""
    changes = 0
    conn = psycopg2.connect(dsn)
    with conn.cursor() as cur:
        for _ in range(transactions):
            for _ in range(rng.randint(1, 8)):
                kind = rng.random()
                if kind < 0.4:
                    cur.execute("INSERT INTO customers (name, email) VALUES (%s, %s) RETURNING id",
                                (f"new {rng.random():.6f}", "x@example.com"))
                    cid = cur.fetchone()[0]
                    cur.execute("INSERT INTO orders (customer_id, sku, quantity, total) "
                                "VALUES (%s, %s, 1, 9.99)", (cid, rng.randint(1, 300)))
                    changes += 2
                elif kind < 0.8:
                    cur.execute("UPDATE products SET stock = stock - 1, price = price + 0.01 "
                                "WHERE sku = %s", (rng.randint(1, 300),))
                    cur.execute("UPDATE orders SET note = %s WHERE id = %s",
                                (f"note {rng.random():.4f}", rng.randint(1, 5000)))
                    changes += 1 + cur.rowcount
                else:
                    cur.execute("DELETE FROM orders WHERE id = %s", (rng.randint(1, 5000),))
                    changes += cur.rowcount
            conn.commit()
    conn.close()
    return changes


def summary(dsn: str, lakehouse: str, tables: list[tuple[str, str]]) -> list[str]:
    """One line per table: source rows, silver rows, bronze events by op, LSN reached."""
    lines = []
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        for schema, table in tables:
            cur.execute(f'SELECT count(*) FROM "{schema}"."{table}"')
            source_rows = cur.fetchone()[0]
            silver = load_table(table_uri(lakehouse, "silver", schema, table)).to_pyarrow_table(
                columns=["__deleted"])
            live = silver.num_rows - pc.sum(silver["__deleted"]).as_py() if silver.num_rows else 0
            bronze = load_table(table_uri(lakehouse, "bronze", schema, table)).to_pyarrow_table(
                columns=["op", "__commit_lsn"])
            ops: dict[str, int] = {}
            for op in bronze["op"].to_pylist():
                ops[op] = ops.get(op, 0) + 1
            by_op = " ".join(f"{k}={v}" for k, v in sorted(ops.items()))
            lines.append(f"{schema}.{table:<10} source={source_rows:<6} silver={live:<6} "
                         f"bronze[{by_op}] {'OK' if live == source_rows else 'MISMATCH'}")
        cur.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                    "WHERE slot_name = 'pgcdc'")
        row = cur.fetchone()
        lines.append(f"slot pgcdc confirmed at LSN {row[0] if row else '-'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default=".demo", help="where PostgreSQL and the lakehouse live")
    parser.add_argument("--batches", type=int, default=3, help="micro-batches to run")
    parser.add_argument("--keep", action="store_true", help="leave PostgreSQL running")
    args = parser.parse_args(argv)

    import dagster as dg

    from pgcdc_dagster.definitions import build_definitions, discover_tables
    from pgcdc_dagster.resources import (
        CaptureResource,
        LakehouseResource,
        PostgresResource,
        SparkResource,
    )

    root = Path(args.dir).resolve()
    lakehouse = str(root / "lakehouse")
    shutil.rmtree(lakehouse, ignore_errors=True)
    if "DAGSTER_HOME" not in os.environ:  # a throwaway instance, removed at exit
        os.environ["DAGSTER_HOME"] = tempfile.mkdtemp(prefix="pgcdc-demo-dagster-")
        atexit.register(shutil.rmtree, os.environ["DAGSTER_HOME"], ignore_errors=True)
    Path(os.environ["DAGSTER_HOME"], "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    print(f"demo: starting PostgreSQL under {root / 'pg'}")
    cluster = LocalCluster(root / "pg").start()
    try:
        dsn = prepare_database(cluster)
        tables = discover_tables(dsn, ["public\\..*"])
        defs = build_definitions(tables, {
            "postgres": PostgresResource(dsn=dsn),
            "lakehouse": LakehouseResource(root=lakehouse),
            "capture": CaptureResource(tables="public\\..*"),
            "spark": SparkResource(),
        })
        rng = random.Random(7)
        instance = dg.DagsterInstance.get()  # DAGSTER_HOME: dynamic partitions persist
        quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}

        def run(job: str, partition_key: str | None = None) -> bool:
            result = defs.resolve_job_def(job).execute_in_process(
                instance=instance, run_config=quiet, raise_on_error=False,
                partition_key=partition_key)
            if not result.success:
                print(f"demo: {job} failed (see the errors above)", file=sys.stderr)
            return bool(result.success)

        print("demo: initial snapshot (while a writer keeps changing the tables)")
        writer = threading.Thread(target=apply_workload, args=(dsn, random.Random(8), 300))
        writer.start()
        ok = run("initial_snapshot")
        writer.join()
        if not ok:
            return 1
        for batch in range(1, args.batches + 1):
            changes = apply_workload(dsn, rng, 200)
            print(f"demo: micro-batch {batch} after ~{changes} changes")
            if not run("cdc_microbatch"):
                return 1
        print("demo: incremental snapshot of public.products (DBLog watermarks) while a "
              "writer keeps changing the tables")
        writer = threading.Thread(target=apply_workload, args=(dsn, random.Random(9), 200))
        writer.start()
        ok = run("incremental_snapshot", partition_key="public.products")
        writer.join()
        if not ok:
            return 1
        print("demo: last micro-batch")
        if not run("cdc_microbatch"):
            return 1
        print("\n".join(["", "summary:", *summary(dsn, lakehouse, tables)]))
        print(f"\nDelta tables: {lakehouse}/bronze/<schema>/<table> and "
              f"{lakehouse}/silver/<schema>/<table>")
        if args.keep:
            print(f"PostgreSQL keeps running: export PGCDC_PG_DSN='{dsn}' "
                  f"PGCDC_LAKEHOUSE='{lakehouse}' and run: .venv/bin/dagster dev")
    finally:
        if not args.keep:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
