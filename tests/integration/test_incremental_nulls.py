"""NULL-aware incremental-snapshot chunks (INC-05 key order, INC-10 dedup).

Chunks follow ``ORDER BY k1 ASC NULLS LAST, …`` with NULL-aware bounds when an ordering
column is nullable: a nullable ``surrogate-key`` (``sk.grp``) and a ``message.key.columns``
key on nullable columns (``nk (a, b)``, unique NULLS NOT DISTINCT, REPLICA IDENTITY FULL).
Every row is read in exactly one chunk, NULLs in any position included; with writers
changing rows (surrogate values to and from NULL, NULL-keyed rows updated and deleted) inside
every chunk window, silver equals the source (NULL-keyed rows included).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import psycopg2
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture import incremental
from pgcdc_dagster.capture.incremental import apply_signal, run_incremental
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.dblog import parse_signal
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.silver import live_rows
from pgcdc_dagster.postgres.chunks import ChunkSpec, chunk_select, max_key, ordering, read_chunk
from tests.integration.test_incremental import micro_batch
from tests.support.bronze_state import bronze_state
from tests.support.compare import assert_silver_equals_source, source_rows

pytestmark = [pytest.mark.integration]

TRIPLE = """
CREATE TABLE triple (x int, y text, z int, v int);
INSERT INTO triple SELECT x, y, z, 0
    FROM (VALUES (1), (2), (NULL)) a(x), (VALUES ('a'), ('b'), (NULL)) b(y),
         (VALUES (10), (NULL), (-5)) c(z);
"""
SOURCES = """
CREATE TABLE anchor (id int PRIMARY KEY);
INSERT INTO anchor VALUES (1);
"""
LATE = """
CREATE TABLE sk (id int PRIMARY KEY, grp int, n int);
INSERT INTO sk SELECT g, CASE WHEN g % 4 = 0 THEN NULL ELSE g % 7 END, g
    FROM generate_series(1, 150) g;
CREATE TABLE nk (a int, b text, n int);
CREATE UNIQUE INDEX nk_key ON nk (a, b) NULLS NOT DISTINCT;
ALTER TABLE nk REPLICA IDENTITY FULL;
INSERT INTO nk SELECT CASE WHEN g % 5 = 0 AND g % 3 <> 0 THEN NULL ELSE g END,
                      CASE WHEN g % 3 = 0 THEN NULL WHEN g % 5 = 0 THEN 'n' || g
                           ELSE 'b' || (g % 4) END, g
    FROM generate_series(1, 120) g;
INSERT INTO nk VALUES (NULL, NULL, -1);
"""


def check(pg_conn, lakehouse: Path) -> None:
    """``sk`` and ``nk`` (NULLs in key columns) through silver, one live row per key; ``nk``
    also through the bronze events folded per key."""
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "sk"),
                                "public", "sk", ["id"])
    uri = table_uri(str(lakehouse), "silver", "public", "nk")
    count = assert_silver_equals_source(pg_conn, uri, "public", "nk", ["a", "b"])
    assert live_rows(uri).num_rows == count
    expected = source_rows(pg_conn, "public", "nk", ["a", "b"])
    actual = bronze_state(table_uri(str(lakehouse), "bronze", "public", "nk"), ["a", "b"])
    assert actual == expected, (sorted(expected.keys() - actual.keys(), key=str)[:5],
                                sorted(actual.keys() - expected.keys(), key=str)[:5])


def _walk(dsn: str, spec: ChunkSpec, limit: int) -> tuple[list[tuple], int]:
    """Read the table chunk after chunk up to its max key; return the keys read, in order."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    upto = max_key(conn, spec)
    conn.close()
    keys: list[tuple] = []
    after = None
    chunks = 0
    while True:
        rows, last = read_chunk(dsn, spec, after, upto, limit)
        if not rows:
            return keys, chunks
        chunks += 1
        pos = [spec.columns.index(k.name) for k in spec.order]
        keys.extend(tuple(r[p] for p in pos) for r in rows)
        after = last


def test_chunks_cover_null_keys_once(pg_dsn, pg_conn) -> None:
    """INC-05: a three-column key with NULLs in every position (27 combinations) is walked
    in key order, NULLs last, for every chunk size from 1 up: each row exactly once; rows
    inserted after the end key was fixed (NULL keys included) are not read."""
    with pg_conn.cursor() as cur:
        cur.execute(TRIPLE)
        cur.execute("SELECT x::text, y, z::text FROM triple "
                    "ORDER BY x NULLS LAST, y NULLS LAST, z NULLS LAST")
        expected = [tuple(None if v is None else v.encode() for v in row)
                    for row in cur.fetchall()]
    order, nullable = ordering(pg_conn, "public", "triple", ["x", "y", "z"])
    assert nullable == {"x", "y", "z"}
    spec = ChunkSpec("public", "triple", ("x", "y", "z", "v"), order, nullable=nullable)
    assert expected[-1] == (None, None, None) and len(expected) == 27
    for limit in (1, 2, 3, 4, 5, 8, 26, 27, 100):
        keys, chunks = _walk(pg_dsn, spec, limit)
        assert keys == expected, limit
        assert chunks == -(-27 // limit)
    # The end key is fixed before the walk: with it, later rows are excluded even when they
    # sort last (NULL keys), and a filter still applies.
    upto = max_key(pg_conn, dataclasses.replace(spec, condition="z IS NOT NULL"))
    assert upto == [None, None, "10"]
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO triple VALUES (NULL, NULL, 99, 1), (3, NULL, NULL, 1)")
    rows, _ = read_chunk(pg_dsn, spec, ["2", None, "10"], upto, 100)
    assert [r[:3] for r in rows] == [(b"2", None, None), (b"3", None, None),
                                     (None, b"a", b"-5"), (None, b"a", b"10"),
                                     (None, b"a", None), (None, b"b", b"-5"),
                                     (None, b"b", b"10"), (None, b"b", None),
                                     (None, None, b"-5"), (None, None, b"10")]


def _settings(dsn: str, lakehouse: Path, include: str) -> CaptureSettings:
    return CaptureSettings(dsn=dsn, lakehouse=str(lakehouse), include=(include,),
                           slot="nulls", publication="nulls", window_max_bytes=4 << 20,
                           column_options=(("message.key.columns", "public.nk:a,b"),))


def _incremental_keys(lakehouse: Path, table: str, names: list[str]) -> list[tuple]:
    data = DeltaTable(table_uri(str(lakehouse), "bronze", "public", table)).to_pyarrow_table(
        columns=["op", "source", "after"])
    snap = pc.struct_field(data["source"], "snapshot").to_pylist()
    return [tuple(a[n] for n in names) for a, op, s in
            zip(data["after"].to_pylist(), data["op"].to_pylist(), snap, strict=True)
            if op == "r" and s == "incremental"]


def test_nullable_surrogate_and_key_converge(pg_dsn, pg_conn, spark, lakehouse,
                                             monkeypatch) -> None:
    """INC-05/INC-10 with NULLs: ``sk`` is chunked by a nullable surrogate key, ``nk`` by a
    nullable composite ``message.key.columns`` key; both join the capture after the initial
    snapshot, so their rows reach silver only through the incremental snapshot and the
    stream. Quiet first pass: every row read exactly once. Second pass: seeded writes inside
    every chunk window (before and after the chunk read) move surrogate values to and from
    NULL and update, delete and insert NULL-keyed rows; silver equals the source.

    DBLog dedup of NULL keys: keys are compared NULL-equals-NULL (IS NOT DISTINCT FROM),
    matching a NULLS NOT DISTINCT unique key; a change to (NULL, 'b1') evicts the chunk's
    (NULL, 'b1') row and nothing else."""
    with pg_conn.cursor() as cur:
        cur.execute(SOURCES)
    run_bronze(_settings(pg_dsn, lakehouse, r"public\.anchor"), spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute(LATE)
    settings = _settings(pg_dsn, lakehouse, r"public\.(anchor|sk|nk)")
    micro_batch(settings)  # sk and nk join the publication; their rows are not streamed

    # Pass 1, no writes: the chunks read every row exactly once.
    apply_signal(settings, parse_signal("q", "execute-snapshot", {
        "data-collections": ["public.sk"], "surrogate-key": "grp"}), chunk_size=9)
    apply_signal(settings, parse_signal("q", "execute-snapshot", {
        "data-collections": ["public.nk"]}), chunk_size=8)
    report = {t.table: t for t in run_incremental(settings).tables}
    assert report["public.sk"].status == report["public.nk"].status == "done"
    assert report["public.sk"].chunks_done == 17 and report["public.nk"].chunks_done == 16
    sk_keys = _incremental_keys(lakehouse, "sk", ["id"])
    assert sorted(sk_keys) == [(i,) for i in range(1, 151)]
    nk_keys = _incremental_keys(lakehouse, "nk", ["a", "b"])
    with pg_conn.cursor() as cur:
        cur.execute("SELECT a, b FROM nk")
        source_nk = cur.fetchall()
    assert len(nk_keys) == len(set(nk_keys)) == 121
    assert set(nk_keys) == set(source_nk)
    run_silver(settings, spark, only=[("public", "sk"), ("public", "nk")])
    check(pg_conn, lakehouse)

    # Pass 2: writes inside every chunk window, before and after the read.
    rng = random.Random(8)
    real = incremental.read_chunk
    in_window = [0]

    def write(cur, table: str) -> None:  # type: ignore[no-untyped-def]
        for _ in range(3):
            r = rng.random()
            i = rng.randint(1, 160)
            if table == "sk":
                if r < 0.4:
                    cur.execute("UPDATE sk SET grp = %s, n = n + 1 WHERE id = %s",
                                (rng.choice([None, None, 0, 3, 6, 9]), i))
                elif r < 0.6:
                    cur.execute("DELETE FROM sk WHERE id = %s", (i,))
                elif r < 0.8:
                    cur.execute("INSERT INTO sk VALUES (%s, %s, 0) ON CONFLICT DO NOTHING",
                                (1000 + i, rng.choice([None, 2])))
                else:
                    cur.execute("UPDATE sk SET n = -n WHERE grp IS NULL AND id %% 7 = %s",
                                (i % 7,))
            else:
                a = None if rng.random() < 0.4 else i
                b = rng.choice([None, "b1", "b2", "b3"])
                if r < 0.4:
                    cur.execute("UPDATE nk SET n = n + 1000 WHERE a IS NOT DISTINCT FROM %s "
                                "AND b IS NOT DISTINCT FROM %s", (a, b))
                elif r < 0.6:
                    cur.execute("DELETE FROM nk WHERE a IS NOT DISTINCT FROM %s "
                                "AND b IS NOT DISTINCT FROM %s", (a, b))
                elif r < 0.8:
                    cur.execute("INSERT INTO nk VALUES (%s, %s, 7) ON CONFLICT DO NOTHING",
                                (a, b))
                else:  # a key change into or out of NULL
                    cur.execute("UPDATE nk SET b = %s WHERE a = %s AND b IS NOT NULL "
                                "AND NOT EXISTS (SELECT 1 FROM nk o WHERE o.a = %s "
                                "AND o.b IS NULL)", (None, i, i))
            in_window[0] += cur.rowcount

    def racing_read(dsn, spec, after, upto, limit):  # type: ignore[no-untyped-def]
        with pg_conn.cursor() as cur:
            write(cur, spec.table)
        out = real(dsn, spec, after, upto, limit)
        with pg_conn.cursor() as cur:
            write(cur, spec.table)
        return out

    monkeypatch.setattr(incremental, "read_chunk", racing_read)
    apply_signal(settings, parse_signal("w", "execute-snapshot", {
        "data-collections": ["public.sk"], "surrogate-key": "grp"}), chunk_size=11)
    apply_signal(settings, parse_signal("w", "execute-snapshot", {
        "data-collections": ["public.nk"]}), chunk_size=10)
    second = {t.table: t for t in run_incremental(settings).tables}
    monkeypatch.setattr(incremental, "read_chunk", real)
    micro_batch(settings)
    run_silver(settings, spark, only=[("public", "sk"), ("public", "nk")])
    check(pg_conn, lakehouse)
    assert second["public.sk"].status == second["public.nk"].status == "done"
    assert in_window[0] > 20  # rows really changed inside the windows
    assert second["public.sk"].rows_dropped + second["public.nk"].rows_dropped > 0


def _removed(plan: dict) -> int:
    return int(plan.get("Rows Removed by Filter", 0)) + sum(_removed(p)
                                                            for p in plan.get("Plans", []))


def test_null_aware_chunks_use_index_ranges(pg_dsn, pg_conn) -> None:
    """INC-02/INC-05: with a nullable ordering column, a chunk in the middle of the table
    reads index ranges starting at its cursor (the rows before it are not scanned and
    filtered away, which would make a snapshot quadratic in the table size)."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE big (id int PRIMARY KEY, g int, v text)")
        cur.execute("INSERT INTO big SELECT i, CASE WHEN i % 10 = 0 THEN NULL "
                    "ELSE (i * 7919) % 5000 END, 'v' FROM generate_series(1, 20000) i")
        cur.execute("CREATE INDEX ON big (g, id)")
        cur.execute("ANALYZE big")
    order, nullable = ordering(pg_conn, "public", "big", ["id"], "g")
    spec = ChunkSpec("public", "big", ("id", "g", "v"), order, nullable=nullable)
    upto = max_key(pg_conn, spec)
    for after in (["2500", "7"], [None, "10000"]):
        query = chunk_select(spec, after, upto, 1000).as_string(pg_conn)
        with pg_conn.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query)
            plan = cur.fetchone()[0][0]["Plan"]
        assert _removed(plan) < 100, (after, plan)
        assert plan["Actual Rows"] == 1000
