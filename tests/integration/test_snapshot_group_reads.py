"""The chunks of a group of small tables share one snapshot transaction.

A group (one Spark task) reads its small tables one after the other in a single REPEATABLE
READ transaction that imported the exported snapshot, on one connection, instead of one
connection, snapshot import and set of session settings per chunk (binary and text COPY
alike). Run here as a Spark
worker runs it (``run_unit``), against the real server: the server counts the sessions the
group opened; every table reads exactly its rows at the exported point (rows inserted after
the export stay out, on the first connection and on the next); an override chunk's
statement_timeout does not carry over to the next chunk; and a table dropped meanwhile fails
alone: its error comes back for it, the connection is replaced, and the rest of the group
still reads at the same point.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import psycopg2.extensions
import pyarrow.parquet as pq
import pytest

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.postgres.arrow_reader import read_batches
from pgcdc_dagster.postgres.chunk_plan import key_columns_of
from pgcdc_dagster.postgres.exported_snapshot import ExportedPoint, temporary_exported_snapshot
from pgcdc_dagster.postgres.snapshot_read import Chunk
from pgcdc_dagster.spark.snapshot_tasks import ChunkGroup, ChunkResult, ChunkTask, run_unit

pytestmark = [pytest.mark.integration]

TABLES = 6
SLOW = "t3"
"""Read through a SELECT override that sleeps longer than the timeout of the chunk before."""


def _sessions(conn: psycopg2.extensions.connection, at_least: int = 0) -> int:
    """Sessions the server has counted in this database, once the count has settled (a
    backend's session is counted as it exits, a moment after its client closed it)."""
    deadline = time.monotonic() + 15
    last = -1
    with conn.cursor() as cur:
        while True:
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute("SELECT sessions FROM pg_stat_database WHERE datname = "
                        "current_database()")
            row = cur.fetchone()
            value = int(row[0]) if row else 0
            if (value == last and value >= at_least) or time.monotonic() > deadline:
                return value
            last = value
            time.sleep(0.5)


def _tasks(dsn: str, conn: psycopg2.extensions.connection, contexts: list[TableContext],
           point: ExportedPoint) -> tuple[ChunkTask, ...]:
    keys = key_columns_of(conn, [c.relation.qualified for c in contexts])
    slow = f"SELECT t.* FROM grp.{SLOW} t, (SELECT pg_sleep(0.8)) s"
    return tuple(ChunkTask(
        dsn, point.snapshot_name, Chunk(*ctx.relation.qualified, 0), ctx.relation,
        ctx.converters, ctx.bronze_schema, ctx.silver_schema,
        tuple(keys[ctx.relation.qualified]), slow if ctx.relation.name == SLOW else None,
        ctx.bronze_uri, ctx.silver_uri, SourceIdentity("grp", "db"), point.lsn,
        1_700_000_000_000, file_prefix="grp",
        statement_timeout_ms=300 if ctx.relation.name == "t1" else 0)
        for ctx in contexts)


def _ids(ctx: TableContext, result: ChunkResult) -> list[int]:
    assert result.error is None and result.bronze is not None, result.error
    data = pq.read_table(f"{ctx.bronze_uri}/{result.bronze.path}", columns=["after"])
    return sorted(a["id"] for a in data.column("after").to_pylist())


def _expected(ctx: TableContext) -> list[int]:
    """The rows at the exported point: ``10 + i`` of table ``t<i>``, not the late one."""
    return list(range(1, 11 + int(ctx.relation.name[1:])))


def test_group_shares_one_snapshot_transaction(pg_dsn, pg_conn, lakehouse: Path) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE SCHEMA grp")
        for i in range(TABLES):
            cur.execute(f"CREATE TABLE grp.t{i} (id int PRIMARY KEY, v text)")
            cur.execute(f"INSERT INTO grp.t{i} SELECT g, 'v' || g "
                        "FROM generate_series(1, %s) g", (10 + i,))
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("grp\\..*",))
    contexts = sorted(load_contexts(settings), key=lambda c: c.relation.name)
    by_name = {c.relation.name: c for c in contexts}
    for ctx in contexts:  # the driver makes the table directories the tasks write into
        for root in (ctx.bronze_uri, ctx.silver_uri):
            os.makedirs(root, exist_ok=True)
    with temporary_exported_snapshot(pg_dsn, "grp_point") as point:
        with pg_conn.cursor() as cur:  # after the export: no chunk may see these
            for i in range(TABLES):
                cur.execute(f"INSERT INTO grp.t{i} VALUES (1000, 'late')")
        tasks = _tasks(pg_dsn, pg_conn, contexts, point)
        # the driver's own connection that loads the type catalog, once per process
        list(read_batches(pg_dsn, None, "SELECT 1 AS one"))
        for group in (tasks, tuple(replace(t, binary=False) for t in tasks)):  # all as text too
            before = _sessions(pg_conn)
            results = run_unit(ChunkGroup(group))
            assert _sessions(pg_conn, before + 1) - before == 1, \
                "one session for the group's six chunks"
            # every chunk at the point; t3 outlived t1's 300 ms timeout (none carried over)
            for ctx, result in zip(contexts, results, strict=True):
                assert _ids(ctx, result) == _expected(ctx), ctx.name
                assert result.lsn == point.lsn

        # A table dropped after the export fails alone; the others still read at the point.
        with pg_conn.cursor() as cur:
            cur.execute("DROP TABLE grp.t2")
        before = _sessions(pg_conn)
        results = run_unit(ChunkGroup(tasks))
        assert _sessions(pg_conn, before + 2) - before == 2, \
            "the connection is replaced once, after the error"
    failed = {r.chunk.table: r.error for r in results if r.error is not None}
    assert list(failed) == ["t2"]
    assert failed["t2"] is not None and failed["t2"].kind == "TableVanishedError"
    assert "grp.t2" in failed["t2"].message
    for result in results:
        if result.chunk.table != "t2":
            ctx = by_name[result.chunk.table]
            assert _ids(ctx, result) == _expected(ctx), ctx.name
