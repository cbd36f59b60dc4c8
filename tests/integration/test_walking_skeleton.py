"""Issue 2 walking skeleton: snapshot + micro-batches land exact bronze and silver.

Covers SNAP-03/05 (consistent snapshot then stream from its point), STR-18 (advance only
after the commit), EVT-12 (op codes c/u/d/r), FT-10 (no duplicates on re-run).
"""

from __future__ import annotations

import random

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = """
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, active boolean,
                       balance numeric(14,2), opened timestamptz);
CREATE TABLE events (id bigint PRIMARY KEY, account_id int, kind text, amount numeric,
                     at timestamptz, flag boolean, small smallint);
CREATE TABLE "Mixed Case" ("Key" int, part text, "Value" text, PRIMARY KEY ("Key", part));
INSERT INTO accounts SELECT g, 'owner ' || g, g % 2 = 0, g * 1.25,
    '2024-01-01'::timestamptz + g * interval '1 hour' FROM generate_series(1, 500) g;
INSERT INTO events SELECT g, 1 + g % 500, 'k' || (g % 7), g / 3.0, now(), NULL, (g % 100)::smallint
    FROM generate_series(1, 800) g;
INSERT INTO "Mixed Case" SELECT g, 'p' || (g % 3), 'v ' || g FROM generate_series(1, 300) g;
"""


class Workload:
    """Random inserts/updates/deletes; counts the change events each table should receive."""

    def __init__(self, conn, seed: int) -> None:
        self.conn = conn
        self.rng = random.Random(seed)
        self.next_event = 10_000
        self.next_account = 10_000
        self.expected: dict[str, dict[str, int]] = {
            t: {"c": 0, "u": 0, "d": 0} for t in ("accounts", "events", "Mixed Case")}

    def _count(self, table: str, op: str, n: int) -> None:
        self.expected[table][op] += n

    def run(self, transactions: int) -> int:
        rng = self.rng
        self.conn.autocommit = False
        with self.conn.cursor() as cur:
            for _ in range(transactions):
                for _ in range(rng.randint(1, 6)):
                    r = rng.random()
                    if r < 0.3:
                        self.next_event += 1
                        cur.execute(
                            "INSERT INTO events VALUES (%s, %s, %s, %s, now(), %s, %s)",
                            (self.next_event, rng.randint(1, 500), "ins",
                             rng.choice([None, "12.5", "-0.001", "123456789.123456789"]),
                             rng.choice([True, False, None]), rng.randint(-32768, 32767)))
                        self._count("events", "c", 1)
                    elif r < 0.45:
                        self.next_account += 1
                        cur.execute("INSERT INTO accounts VALUES (%s, %s, true, 0, now())",
                                    (self.next_account, f"ünïcode {self.next_account}"))
                        self._count("accounts", "c", 1)
                    elif r < 0.7:
                        cur.execute("UPDATE accounts SET balance = balance + 1.01, "
                                    "active = NOT active WHERE id = %s", (rng.randint(1, 600),))
                        self._count("accounts", "u", cur.rowcount)
                    elif r < 0.8:
                        cur.execute("UPDATE events SET kind = kind || '+', amount = NULL "
                                    "WHERE id BETWEEN %s AND %s", (n := rng.randint(1, 800), n + 3))
                        self._count("events", "u", cur.rowcount)
                    elif r < 0.9:
                        cur.execute('UPDATE "Mixed Case" SET "Value" = %s WHERE "Key" = %s',
                                    (f"w{rng.random()}", rng.randint(1, 300)))
                        self._count("Mixed Case", "u", cur.rowcount)
                    else:
                        cur.execute("DELETE FROM events WHERE id = %s", (rng.randint(1, 12_000),))
                        self._count("events", "d", cur.rowcount)
                        cur.execute('DELETE FROM "Mixed Case" WHERE "Key" = %s',
                                    (rng.randint(1, 300),))
                        self._count("Mixed Case", "d", cur.rowcount)
                self.conn.commit()
        self.conn.autocommit = True
        return sum(sum(v.values()) for v in self.expected.values())


def _bronze_ops(lakehouse, table: str) -> dict[str, int]:
    data = DeltaTable(table_uri(str(lakehouse), "bronze", "public", table)).to_pyarrow_table(
        columns=["op"])
    counts = pc.value_counts(data["op"]).to_pylist()
    return {c["values"]: c["counts"] for c in counts}


def test_snapshot_then_microbatches_converge(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                               slot="skeleton", publication="skeleton",
                               window_max_bytes=2 << 20)
    run = run_bronze(settings, spark, force_snapshot_step=True)
    assert run.snapshot is not None and run.snapshot.performed
    assert {t.table: t.rows for t in run.snapshot.tables} == {
        "public.Mixed Case": 300, "public.accounts": 500, "public.events": 800}
    run_silver(settings, spark)

    workload = Workload(pg_conn, seed=42)
    changes = 0
    for _ in range(4):
        changes = workload.run(700)
        run = run_bronze(settings, spark, force_snapshot_step=False)
        assert run.stream is not None
        run_silver(settings, spark)
    assert changes >= 10_000

    with pg_conn.cursor() as cur:
        cur.execute("CHECKPOINT")
    for table, key in (("accounts", ["id"]), ("events", ["id"]), ("Mixed Case", ["Key", "part"])):
        uri = table_uri(str(lakehouse), "silver", "public", table)
        assert_silver_equals_source(pg_conn, uri, "public", table, key)
        ops = _bronze_ops(lakehouse, table)
        expected = {op: n for op, n in workload.expected[table].items() if n}
        snapshot_rows = {"accounts": 500, "events": 800, "Mixed Case": 300}[table]
        assert ops == {"r": snapshot_rows, **expected}, table

    versions = {t: DeltaTable(table_uri(str(lakehouse), "bronze", "public", t)).version()
                for t in ("accounts", "events", "Mixed Case")}
    run = run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    assert all(not w.events_by_table for w in run.stream.windows)
    for t, v in versions.items():
        assert DeltaTable(table_uri(str(lakehouse), "bronze", "public", t)).version() == v
