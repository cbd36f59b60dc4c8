"""Randomized convergence (issue 6): concurrent writers, every change kind, micro-batches
interleaved; afterwards silver equals the source and bronze holds exactly one event per
change, checked against PostgreSQL's own test_decoding plugin on a slot created at the same
point of the WAL."""

from __future__ import annotations

import random
import re
import threading
from collections import Counter

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.postgres.connection import connect
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = """
CREATE TABLE plain (id int PRIMARY KEY, n int, doc text);
CREATE TABLE full_ident (id int PRIMARY KEY, n int, doc text);
ALTER TABLE full_ident REPLICA IDENTITY FULL;
CREATE TABLE composite (a int, b text, n int, PRIMARY KEY (a, b));
INSERT INTO plain SELECT g, g, 'd' || g FROM generate_series(1, 200) g;
INSERT INTO full_ident SELECT g, g, 'd' || g FROM generate_series(1, 200) g;
INSERT INTO composite SELECT g, 'k' || (g % 3), g FROM generate_series(1, 200) g;
"""
BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300))"
KEY_RE = {"plain": r"id\[integer\]:(-?\d+)", "full_ident": r"id\[integer\]:(-?\d+)",
          "composite": r"a\[integer\]:(-?\d+) b\[text\]:'([^']*)'"}
TD_LINE = re.compile(r"^table public\.(\w+): (INSERT|UPDATE|DELETE|TRUNCATE):(.*)$")


def writer(dsn: str, worker: int, seed: int, transactions: int) -> None:
    rng = random.Random(seed)
    conn = connect(dsn, autocommit=False)
    cur = conn.cursor()
    next_id = 100_000 * (worker + 1)
    for _ in range(transactions):
        for _ in range(rng.randint(1, 5)):
            table = rng.choice(["plain", "full_ident"])
            pick = rng.randrange(1, 200) * 2 + worker  # each worker owns its own keys
            r = rng.random()
            if r < 0.2:
                next_id += 1
                cur.execute(f"INSERT INTO {table} VALUES (%s, 0, {BIG})", (next_id,))
            elif r < 0.45:
                cur.execute(f"UPDATE {table} SET n = n + 1 WHERE id %% 2 = %s AND id = ANY(%s)",
                            (worker, [pick, next_id]))  # leaves a TOASTed doc unchanged
            elif r < 0.55:
                cur.execute(f"UPDATE {table} SET doc = {BIG} WHERE id = %s", (next_id,))
            elif r < 0.62:
                next_id += 1
                cur.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (next_id, pick))
            elif r < 0.75:
                cur.execute(f"DELETE FROM {table} WHERE id = %s", (pick,))
            elif r < 0.85:
                cur.execute("INSERT INTO composite VALUES (%s, %s, 1) ON CONFLICT (a, b) DO "
                            "UPDATE SET n = composite.n + 1", (pick, f"w{worker}"))
            elif r < 0.9:
                cur.execute("DELETE FROM composite WHERE a = %s AND b = %s", (pick, f"w{worker}"))
            elif r < 0.95:
                cur.execute("SAVEPOINT s")
                cur.execute("INSERT INTO plain VALUES (-1, -1, 'rolled back')")
                cur.execute("ROLLBACK TO SAVEPOINT s")
            else:
                cur.execute("SELECT pg_logical_emit_message(true, 'app', 'hello')")
        conn.commit()
    conn.close()


def expected_events(lines: list[str]) -> dict[str, Counter[str]]:
    """Events per table and op that Debezium semantics derive from test_decoding output."""
    out: dict[str, Counter[str]] = {}
    for line in lines:
        m = TD_LINE.match(line)
        if not m:
            continue
        table, op, rest = m.groups()
        counts = out.setdefault(table, Counter())
        if op == "INSERT":
            counts["c"] += 1
        elif op == "DELETE":
            counts["d"] += 1
        elif op == "TRUNCATE":
            counts["t"] += 1
        elif "old-key:" in rest:
            old, new = rest.split("new-tuple:")
            key = re.compile(KEY_RE[table])
            if key.search(old).groups() != key.search(new).groups():
                counts["d"] += 1  # a key change is a delete of the old key
                counts["c"] += 1  # plus a create of the new one
            else:
                counts["u"] += 1
        else:
            counts["u"] += 1
    return out


def test_concurrent_writers_converge(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                               slot="conv", publication="conv", window_max_bytes=256 << 10)
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:  # the oracle starts where our stream starts
        cur.execute("SELECT pg_create_logical_replication_slot('oracle', 'test_decoding')")
    threads = [threading.Thread(target=writer, args=(pg_dsn, w, 1000 + w, 250)) for w in (0, 1)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        run_bronze(settings, spark, force_snapshot_step=False)
        run_silver(settings, spark)
    for t in threads:
        t.join()
    with pg_conn.cursor() as cur:
        cur.execute("TRUNCATE full_ident")
        cur.execute("INSERT INTO full_ident VALUES (1, 1, 'after truncate')")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)

    with pg_conn.cursor() as cur:
        cur.execute("SELECT lsn, data FROM pg_logical_slot_get_changes('oracle', NULL, NULL)")
        rows = cur.fetchall()
    expected = expected_events([data for _lsn, data in rows])
    for table, key in (("plain", ["id"]), ("full_ident", ["id"]), ("composite", ["a", "b"])):
        bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", table)) \
            .to_pyarrow_table(columns=["op"])
        stream = bronze.filter(pc.not_equal(bronze["op"], "r"))
        got = Counter(stream["op"].to_pylist())
        assert got == expected.get(table, Counter()), table
        assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", table),
                                    "public", table, key)
    assert sum(sum(c.values()) for c in expected.values()) > 800
