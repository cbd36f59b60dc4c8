"""The initial snapshot: slot with exported snapshot, parallel chunk reads, bronze + silver.

Lock-free and consistent (design.md §3, decision 7; SNAP-03..05): the slot is created with
``EXPORT_SNAPSHOT`` on a replication connection held open while every chunk reader imports
that snapshot; streaming then starts at the slot's consistent point, so no change is lost or
doubled at the hand-off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.tables import TableContext, build_context
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.delta import commit_files, committed_version, ensure_table, open_table
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.discovery import check_server, current_database, resolve_tables
from pgcdc_dagster.postgres.slot import create_slot_with_snapshot, ensure_publication, slot_info
from pgcdc_dagster.postgres.snapshot_read import plan_chunks, table_blocks
from pgcdc_dagster.spark.snapshot_tasks import ChunkResult, ChunkTask, run_chunks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

BLOCK_SIZE = 8192


@dataclass
class TableSnapshotReport:
    """Outcome of the snapshot of one table."""

    table: str
    rows: int
    chunks: int
    bronze_version: int
    silver_version: int


@dataclass
class SnapshotReport:
    """Outcome of one initial-snapshot run."""

    performed: bool
    consistent_point: Lsn | None
    tables: list[TableSnapshotReport] = field(default_factory=list)
    seconds: float = 0.0
    reason: str = ""

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)


def load_contexts(settings: CaptureSettings) -> list[TableContext]:
    """Check the server, resolve the include list and build every table's context."""
    with connection(settings.dsn) as conn:
        check_server(conn)
        relations = resolve_tables(conn, settings.include, settings.exclude)
        return [build_context(conn, r, settings) for r in relations]


def snapshot_done(ctx: TableContext) -> bool:
    """True when the table's bronze holds a committed snapshot for this capture."""
    return committed_version(open_table(ctx.bronze_uri), ctx.bronze_app_id) is not None


def run_initial_snapshot(settings: CaptureSettings, spark: SparkSession) -> SnapshotReport:
    """Create the slot and snapshot every captured table, unless a snapshot already exists."""
    started = time.monotonic()
    contexts = load_contexts(settings)
    with connection(settings.dsn) as conn:
        ensure_publication(conn, settings.publication, [c.relation for c in contexts],
                           settings.publication_autocreate)
        existing = slot_info(conn, settings.slot)
    if settings.snapshot_mode in ("no_data", "never"):
        raise ConfigurationError("snapshot.mode = no_data is handled by the micro-batch job")
    if existing is not None:
        missing = [c.name for c in contexts if not snapshot_done(c)]
        if not missing:
            return SnapshotReport(False, existing.confirmed_flush_lsn,
                                  reason=f"slot {settings.slot!r} exists and every table has "
                                         "its snapshot; nothing to do")
        raise ConfigurationError(
            f"slot {settings.slot!r} already exists but these tables have no snapshot in bronze: "
            f"{', '.join(missing)}. A consistent initial snapshot needs a new slot: run the "
            "teardown job (drops slot and publication) and run initial_snapshot again."
        )
    with connection(settings.dsn) as conn:
        ident = SourceIdentity(settings.topic_prefix, current_database(conn))
    with create_slot_with_snapshot(settings.dsn, settings.slot) as exported:
        log.info("slot %s created at %s, snapshot %s", exported.name, exported.consistent_point,
                 exported.snapshot_name)
        tasks = _plan(settings, contexts, exported.snapshot_name, int(exported.consistent_point),
                      ident)
        results = run_chunks(spark, tasks)
    report = SnapshotReport(True, exported.consistent_point)
    for ctx in contexts:
        mine = [r for r in results if (r.chunk.schema, r.chunk.table) == ctx.relation.qualified]
        report.tables.append(_commit_table(ctx, mine, int(exported.consistent_point)))
    report.seconds = time.monotonic() - started
    return report


def _plan(settings: CaptureSettings, contexts: Sequence[TableContext], snapshot_name: str,
          lsn: int, ident: SourceIdentity) -> list[ChunkTask]:
    tasks = []
    now_ms = int(time.time() * 1000)
    blocks_per_chunk = max(1, settings.snapshot_chunk_bytes // BLOCK_SIZE)
    with connection(settings.dsn) as conn:
        for ctx in contexts:
            ensure_table(ctx.bronze_uri, ctx.bronze_schema)
            ensure_table(ctx.silver_uri, ctx.silver_schema)
            blocks = table_blocks(conn, ctx.relation.namespace, ctx.relation.name)
            for chunk in plan_chunks(ctx.relation.namespace, ctx.relation.name, blocks,
                                     blocks_per_chunk):
                tasks.append(ChunkTask(
                    settings.dsn, snapshot_name, chunk, ctx.relation, ctx.converters,
                    ctx.bronze_uri, ctx.silver_uri, ident, lsn, "true", now_ms))
    return tasks


def _commit_table(ctx: TableContext, results: Sequence[ChunkResult],
                  lsn: int) -> TableSnapshotReport:
    rows = sum(r.rows for r in results)
    meta = {"pgcdc.kind": "snapshot", "pgcdc.lsn": str(Lsn(lsn)), "pgcdc.rows": str(rows)}
    bronze = ensure_table(ctx.bronze_uri, ctx.bronze_schema)
    b_version = commit_files(bronze, [r.bronze for r in results if r.bronze], ctx.bronze_schema,
                             mode="append", app_id=ctx.bronze_app_id, version=lsn, metadata=meta)
    silver = ensure_table(ctx.silver_uri, ctx.silver_schema)
    s_version = commit_files(silver, [r.silver for r in results if r.silver], ctx.silver_schema,
                             mode="overwrite", app_id=ctx.silver_app_id, version=b_version,
                             metadata=meta)
    return TableSnapshotReport(ctx.name, rows, len(results), b_version, s_version)
