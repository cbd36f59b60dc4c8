"""The snapshot's silver baseline comes out laid out like compaction's: files of
about the target size, each sorted by key, with disjoint key ranges in key order, even when
the heap is not in key order; the first micro-batch rewrites only the files holding its keys;
upkeep finds nothing to do on the snapshot's files and, after it has compacted a batch's
files, a second upkeep rewrites nothing, also when text keys share prefixes longer than the
32 characters the file statistics keep; delta-rs, DuckDB, Polars and Spark read the same
rows."""

from __future__ import annotations

import itertools
from functools import partial
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from psycopg2 import sql

from pgcdc_dagster.capture import snapshot
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.lake.data_files import read_file, stored_files
from pgcdc_dagster.ops.upkeep import upkeep_table
from pgcdc_dagster.spark.snapshot_tasks import ChunkTask
from tests.support.compare import assert_silver_equals_source
from tests.support.delta_log import last_commit_files

pytestmark = pytest.mark.spark

TARGET = 48 << 10
ROWS = 40_000
PREFIX = "customer-account-reference-0000000000-"  # 38 characters: beyond the 32 cut
DDL = [
    # Rows inserted in a shuffled order: the heap is not in key order.
    "CREATE TABLE big (id bigint PRIMARY KEY, n int NOT NULL, name text)",
    f"INSERT INTO big SELECT g, g % 97, md5(g::text) FROM generate_series(1, {ROWS}) g "
    "ORDER BY md5(g::text)",
    # Mixed case: the database's collation may sort it differently from silver's statistics.
    "CREATE TABLE words (k text PRIMARY KEY, n int NOT NULL, v text)",
    f"INSERT INTO words SELECT '{PREFIX}' || CASE WHEN g % 2 = 0 THEN 'A' ELSE 'a' END || "
    f"lpad(g::text, 7, '0'), g, md5(g::text) FROM generate_series(1, {ROWS}) g "
    "ORDER BY md5(g::text)",
]


def _settings(dsn: str, lakehouse: Any) -> CaptureSettings:
    return CaptureSettings(dsn=dsn, lakehouse=str(lakehouse), include=("public\\.(big|words)",),
                           slot="layout", publication="layout", target_file_bytes=TARGET,
                           snapshot_chunk_bytes=1 << 20, snapshot_max_threads=2)


def _files(uri: str, key: str) -> list[tuple[Any, Any, int, int]]:
    """Per data file, in key order: exact (first key, last key), bytes, rows; asserting that
    each file is sorted by key."""
    table = DeltaTable(uri)
    schema = pa.schema(table.schema().to_arrow())
    out = []
    for f in stored_files(table, key):
        keys = read_file(uri, f.path, schema, [key])[key].to_pylist()
        assert keys == sorted(keys), f.path
        out.append((keys[0], keys[-1], f.size, f.rows))
    return sorted(out)


def _rewritten(**kw: Any) -> tuple[int, int]:
    """Silver files removed and added by an upkeep run."""
    silver = next(u for u in upkeep_table(**kw) if u.layer == "silver")
    return silver.compaction.files_removed, silver.compaction.files_added


def test_snapshot_silver_is_clustered_at_the_target_size(pg_dsn, pg_conn, spark, lakehouse,
                                                         monkeypatch) -> None:
    # Row groups of 64 KiB of COPY bytes: each chunk is read in many of them, so its files
    # are disjoint only if the rows arrive in key order (sorting a row group is not enough).
    monkeypatch.setattr(snapshot, "ChunkTask", partial(ChunkTask, row_group_bytes=64 << 10))
    with pg_conn.cursor() as cur:
        for statement in DDL:
            cur.execute(statement)
        cur.execute("ANALYZE")
    settings = _settings(pg_dsn, lakehouse)
    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)
    ctx = {c.name.split(".")[-1]: c for c in load_contexts(settings)}
    upkeep = {"lakehouse": str(lakehouse), "schema": "public", "app_prefix": settings.app_prefix,
              "target_bytes": TARGET, "retention_hours": 168}

    for name, key in (("big", "id"), ("words", "k")):
        uri = ctx[name].silver_uri
        chunks = len(DeltaTable(ctx[name].bronze_uri).file_uris())
        files = _files(uri, key)
        # Several files per chunk, each within compaction's bounds (none to split or merge).
        assert chunks >= 2 and len(files) >= 3 * chunks, (name, chunks, len(files))
        assert all(TARGET / 2 <= size <= 2 * TARGET for _, _, size, _ in files), \
            (name, [size for _, _, size, _ in files])
        # Disjoint key ranges in key order, covering every row once.
        assert all(a[1] < b[0] for a, b in itertools.pairwise(files)), name
        assert sum(rows for *_, rows in files) == ROWS
        assert assert_silver_equals_source(pg_conn, uri, "public", name, [key]) == ROWS
        # Already clustered: upkeep rewrites none of the snapshot's files.
        assert _rewritten(table=name, **upkeep) == (0, 0), name

    # The first micro-batch: updates of the newest 100 keys and of 3 scattered ones rewrite
    # only the files holding them.
    big = ctx["big"].silver_uri
    before = {f.path: f for f in stored_files(DeltaTable(big), "id")}
    keys = [7, ROWS // 3, ROWS // 2, *range(ROWS - 99, ROWS + 1)]
    holding = {p for p, f in before.items() if any(f.low <= k <= f.high for k in keys)}
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE big SET n = n + 1000 WHERE id = ANY(%s)", (keys,))
        # words: updates and inserts inside stored ranges (shared 38-character prefix)
        cur.execute(f"UPDATE words SET n = -n WHERE k LIKE '{PREFIX}a00001%%'")
        cur.execute(f"INSERT INTO words SELECT '{PREFIX}a' || lpad(g::text, 7, '0') || 'x', g, "
                    "'new' FROM generate_series(1, 40000, 400) g")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    removed, added = last_commit_files(big)
    assert removed == holding and len(holding) <= 5 and len(added) <= len(holding)
    assert sum(before[p].size for p in removed) <= 0.4 * sum(f.size for f in before.values())

    # Upkeep: whatever it rewrites, a second run on unchanged data rewrites nothing.
    words = ctx["words"].silver_uri
    for name in ("big", "words"):
        _rewritten(table=name, **upkeep)
        assert _rewritten(table=name, **upkeep) == (0, 0), name
    files = _files(words, "k")
    assert all(a[1] < b[0] for a, b in itertools.pairwise(files))

    # Readers agree with the source: delta-rs (above), Polars, DuckDB, Spark.
    for name, key, uri in (("big", "id", big), ("words", "k", words)):
        rows = assert_silver_equals_source(pg_conn, uri, "public", name, [key])
        with pg_conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT {}, n FROM {}").format(sql.Identifier(key),
                                                                sql.Identifier(name)))
            source = sorted(cur.fetchall())
        assert len(source) == rows
        live = pl.read_delta(uri).filter(~pl.col("__deleted")).select(key, "n")
        assert sorted(live.iter_rows()) == source
        paths = DeltaTable(uri).file_uris()
        duck = duckdb.sql(f"SELECT {key}, n FROM read_parquet($f) WHERE NOT __deleted",
                          params={"f": paths}).fetchall()
        assert sorted(duck) == source
        spark_rows = spark.read.parquet(*paths).where("NOT __deleted").select(key, "n")
        assert sorted(tuple(r) for r in spark_rows.collect()) == source
