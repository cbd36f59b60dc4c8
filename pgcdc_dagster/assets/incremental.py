"""Incremental snapshots in Dagster: a partitioned asset, its backfill policy and its job.

``incremental_snapshot`` is one asset with a dynamic partition per captured table
(``<schema>.<table>``, :data:`INCREMENTAL_PARTITIONS`); launching a backfill over some of its
partitions re-snapshots those tables with the DBLog procedure while the stream keeps
running (``capture/incremental.py``). The backfill policy runs up to
:data:`MAX_PARTITIONS_PER_RUN` tables in one run; every run is in the ``pgcdc_slot`` pool
because it reads the slot (the micro-batch cannot run at the same time).

One run:

1. starts the tables that have no snapshot in progress (an ``execute-snapshot`` signal with
   the run's origin as its id: the root backfill, or the root run of a re-execution) and
   resumes the others: progress is durable per chunk, so a retried partition continues at the
   first chunk not committed;
2. reads windows until every table of the run is done (every captured table's changes are
   written to bronze meanwhile: the run holds the slot);
3. catches the snapshotted tables' silver up;
4. records one materialization per partition with its progress (chunks done / total, rows
   read / emitted / superseded, rows/s), and bronze and silver materializations with the LSN
   range the run read, so the LSN-window check sees no gap.

A table that is paused or stopped (signals) fails its partition; the others of the run are
materialized (a ranged run may fail some partitions and not others), so the UI offers to
retry exactly the failed ones.
"""

# No ``from __future__ import annotations``: Dagster reads the config/resource annotations.

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from pgcdc_dagster.assets.capture import (
    META_TABLES,
    _previous,
    _rate,
    _silver_metadata,
    bronze_column_schema,
)
from pgcdc_dagster.assets.jobs import INCREMENTAL
from pgcdc_dagster.assets.keys import dep_ins
from pgcdc_dagster.assets.naming import DEFAULT_NAMES, CaptureNames
from pgcdc_dagster.assets.partitions import ensure_partitions, partition_table
from pgcdc_dagster.assets.slot_hold import hold_slot_for_run
from pgcdc_dagster.capture.bronze_write import internal_events_key
from pgcdc_dagster.capture.incremental import IncrementalReport, apply_signal, run_incremental
from pgcdc_dagster.capture.incremental_state import ProgressStore, TableProgress
from pgcdc_dagster.capture.silver_apply import apply_silver
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.dblog import Signal, SignalError
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.ops.delta_stats import TableStats, growth, live_row_count, table_stats
from pgcdc_dagster.ops.slot_health import slot_health

INCREMENTAL_JOB = INCREMENTAL
INCREMENTAL_KEY = DEFAULT_NAMES.incremental_key
MAX_PARTITIONS_PER_RUN = 20
SIGNAL_TAG = "pgcdc/signal_id"
# The run tags Dagster documents for partitioned and backfill runs (values, not its modules).
PARTITION_NAME_TAG = "dagster/partition"
ASSET_PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
ASSET_PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"
BACKFILL_ID_TAG = "dagster/backfill"
ROOT_BACKFILL_ID_TAG = "dagster/root_backfill_id"

AssetJob = Any
"""What ``dg.define_asset_job`` returns (its class is not part of Dagster's public API)."""
"""Run tag: the signal (signalling-table row) that requested the run."""


def _collection(schema: str, table: str) -> str:
    """A ``data-collections`` entry matching exactly this table (quoted: literal)."""
    return '"' + schema.replace('"', '""') + '"."' + table.replace('"', '""') + '"'


class IncrementalConfig(dg.Config):
    """Run configuration of ``incremental_snapshot`` (the Dagster signal channel)."""

    chunk_size: int = Field(
        default=0, description="Rows per chunk; 0 uses the capture resource's "
        "incremental_snapshot_chunk_size (incremental.snapshot.chunk.size).")
    additional_condition: str = Field(
        default="", description="additional-conditions filter applied to every table of the "
        "run: one boolean SQL expression over the table's columns, parsed by PostgreSQL's "
        "parser and limited to the filter grammar of docs/incremental.md (columns, constants, "
        "allow-listed operators, functions and casts); read READ ONLY with a statement_timeout.")
    surrogate_key: str = Field(
        default="", description="surrogate-key: a column to order chunks by (then by the "
        "primary key) instead of the primary key alone; NULLs sort last and are read once.")
    restart: bool = Field(
        default=False, description="Start over even when a snapshot of a table is in "
        "progress (by default it is resumed at its first uncommitted chunk).")


def run_origin(run: dg.DagsterRun) -> str:
    """Who asked for the run: a signal, the root backfill, or the root run of a retry."""
    tags = run.tags
    return (tags.get(SIGNAL_TAG) or tags.get(ROOT_BACKFILL_ID_TAG) or tags.get(BACKFILL_ID_TAG)
            or f"dagster-run:{run.root_run_id or run.run_id}")


def _to_start(store: ProgressStore, tables: Sequence[tuple[str, str]], origin: str,
              restart: bool) -> list[tuple[str, str]]:
    """Tables that need a new snapshot: none in progress, or one that ended for another
    request (a retry of the same origin does not start a finished table over)."""
    fresh = []
    for s, t in tables:
        p = store.load(s, t)
        if restart or p is None or p.status == "stopped":
            fresh.append((s, t))
        elif p.status == "done" and p.signal_id != origin:
            fresh.append((s, t))
    return fresh


def _partition_metadata(p: TableProgress | None, run_seconds: float) -> dict[str, Any]:
    if p is None:
        return {"status": "missing"}
    return {
        "status": p.status,
        "snapshot_id": p.snapshot_id,
        "signal_id": str(p.signal_id),
        "chunk_size": p.chunk_size,
        "chunks_done": p.chunks_done,
        "chunks_total": p.chunks_total,
        "progress": dg.MetadataValue.text(f"{p.chunks_done}/{p.chunks_total} chunks"),
        "rows_read": p.rows_read,
        "rows_emitted": p.rows_emitted,
        "rows_superseded": p.rows_dropped,
        "rows_emitted_before_toast_events": p.rows_early,
        "estimated_rows": p.estimated_rows,
        "snapshot_seconds": round(p.seconds, 3),
        "rows_per_s": _rate(p.rows_read, p.seconds),
        "run_duration_s": round(run_seconds, 3),
        "additional_condition": p.condition or "",
        "surrogate_key": p.surrogate_key or "",
    }


def _bronze_events(ctx: TableContext, report: IncrementalReport, before: TableStats,
                   seconds: float) -> dict[str, Any]:
    """Bronze metadata of one table after an incremental run (it read the slot)."""
    events = dict.fromkeys("rcudt", 0)
    windows = 0
    for stream in report.stream:
        windows += len(stream.windows)
        for op, n in stream.events_by_table().get(ctx.name, {}).items():
            events[op] = events.get(op, 0) + n
    after = table_stats(ctx.bronze_uri)
    added = growth(before, after, ctx.bronze_uri)
    total = sum(events.values())
    meta: dict[str, Any] = {"capture_kind": "incremental+stream", "windows": windows,
                            **{f"events_{op}": n for op, n in events.items()},
                            "events": total, "rows_written": added.rows,
                            "bytes_written": added.bytes, "files_written": added.files,
                            "duration_s": round(seconds, 3), "rows_per_s": _rate(total, seconds),
                            "dagster/row_count": after.rows, "table_bytes": after.bytes,
                            "dagster/column_schema": bronze_column_schema(ctx),
                            "dagster/uri": ctx.bronze_uri}
    meta.update(stream_range(report))
    if after.version is not None:
        meta["delta_version"] = after.version
    return meta


def _meta_table_events(name: str, uri: str, report: IncrementalReport, before: TableStats,
                       seconds: float) -> dict[str, Any]:
    """Metadata of ``bronze/_pgcdc/<name>`` after an incremental run."""
    events = sum(sum(s.events_by_table().get(internal_events_key(name), {}).values())
                 for s in report.stream)
    after = table_stats(uri)
    added = growth(before, after, uri)
    meta: dict[str, Any] = {"capture_kind": "incremental+stream", "events": events,
                            "rows_written": added.rows, "bytes_written": added.bytes,
                            "files_written": added.files, "duration_s": round(seconds, 3),
                            "rows_per_s": _rate(events, seconds),
                            "dagster/row_count": after.rows, "table_bytes": after.bytes,
                            "dagster/uri": uri, **stream_range(report)}
    if after.version is not None:
        meta["delta_version"] = after.version
    return meta


def stream_range(report: IncrementalReport) -> dict[str, Any]:
    """``lsn_start``/``lsn_end`` of what the run read from the slot, and the slot's lag."""
    read = [s for s in report.stream if s.start is not None and s.end is not None]
    if not read:
        return {}
    last = read[-1]
    return {"lsn_start": str(read[0].start), "lsn_end": str(last.end),
            "slot_lag_bytes": last.slot_lag_bytes,
            "slot_retained_bytes": last.slot_retained_bytes, "wal_status": str(last.wal_status)}


def build_incremental(tables: Sequence[tuple[str, str]], *,
                      names: CaptureNames = DEFAULT_NAMES
                      ) -> tuple[dg.AssetsDefinition, AssetJob]:
    """The ``incremental_snapshot`` asset and job for the captured tables."""
    captured = list(tables)
    incremental_key = names.incremental_key

    @dg.asset(
        key=incremental_key, partitions_def=names.partitions, pool=names.pool,
        required_resource_keys=names.resource_keys,
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=MAX_PARTITIONS_PER_RUN),
        group_name=names.scoped("incremental"), kinds={"postgres", "spark", "delta"},
        owners=list(names.owners),
        ins=dep_ins([names.slot_key, *(names.source(s, t) for s, t in captured)]),
        tags={"pgcdc/layer": "bronze"},
        description="Incremental snapshots (DBLog watermark windows): one partition per "
        "captured table. Backfill partitions to re-snapshot those tables while the stream "
        f"runs (up to {MAX_PARTITIONS_PER_RUN} tables per run, in the {names.pool} pool); "
        "the rows land in bronze as op r (source.snapshot = incremental) and silver is "
        "caught up. Progress is durable per chunk: retrying a failed partition resumes it.")
    def incremental_snapshot(context: dg.AssetExecutionContext,
                             config: IncrementalConfig) -> dg.MaterializeResult[Any]:
        return run_incremental_snapshot(context, config)

    def run_incremental_snapshot(context: dg.AssetExecutionContext,
                                 config: IncrementalConfig) -> dg.MaterializeResult[Any]:
        postgres, lakehouse, capture, spark = names.bound(context)
        bronze_key, silver_key = names.bronze, names.silver
        hold_slot_for_run(context, capture, postgres.dsn)  # one reader per slot, whole run
        settings = capture.settings(postgres.dsn, lakehouse.root)
        if config.chunk_size > 0:
            settings = dataclasses.replace(settings, incremental_chunk_size=config.chunk_size)
        # A run launched outside a backfill (`dagster job execute --tags
        # '{"dagster/partition": ...}'`, an ephemeral or new instance) may name a table whose
        # partition no bronze run of this instance has added yet: add the captured tables'.
        ensure_partitions(context.instance, captured, names)
        try:
            keys = list(context.partition_keys)
        except dg.DagsterInvalidInvocationError:
            tags = context.run.tags
            asked = tags.get(PARTITION_NAME_TAG) or (
                f"{tags.get(ASSET_PARTITION_RANGE_START_TAG)}..."
                f"{tags.get(ASSET_PARTITION_RANGE_END_TAG)}")
            raise dg.Failure(
                f"partition {asked!r} of {incremental_key.to_user_string()} is not a "
                "captured table: its "
                "partition keys are the captured tables' schema.table (a part holding '.' or "
                "'\"' double-quoted, as in Debezium's data-collections)",
                allow_retries=False) from None
        try:
            wanted = {k: partition_table(k) for k in keys}
        except ValueError as exc:
            raise dg.Failure(str(exc), allow_retries=False) from None
        origin = run_origin(context.run)
        contexts = load_contexts(settings)
        by_name = {c.relation.qualified: c for c in contexts}
        gone = [k for k, name in wanted.items() if name not in by_name]
        if gone:
            raise dg.Failure(f"not captured (dropped, or not matched by the include list): "
                             f"{', '.join(gone)}; reload the code location", allow_retries=False)
        store = ProgressStore(settings.lakehouse, settings.slot)
        fresh = _to_start(store, list(wanted.values()), origin, config.restart)
        if fresh:
            cond = config.additional_condition.strip()
            signal = Signal(origin, "execute-snapshot",
                            tuple(_collection(s, t) for s, t in fresh),
                            additional_conditions=tuple((_collection(s, t), cond)
                                                        for s, t in fresh) if cond else (),
                            surrogate_key=config.surrogate_key.strip() or None)
            try:
                outcome = apply_signal(settings, signal, contexts=contexts)
            except (ConfigurationError, SignalError) as exc:
                raise dg.Failure(str(exc), allow_retries=False) from None
            context.log.info(f"incremental snapshot started for {', '.join(outcome.tables)} "
                             f"(chunk size {settings.incremental_chunk_size})")
        before = {c.relation.qualified: table_stats(c.bronze_uri) for c in contexts}
        meta_before = {n: table_stats(lakehouse.internal(n))
                       for n in META_TABLES}
        started = time.monotonic()
        report = run_incremental(settings, only=set(wanted.values()),
                                 progress=context.log.info)
        seconds = time.monotonic() - started
        for ctx in contexts:  # the run read the slot for every table: keep the LSN chain
            context.log_event(dg.AssetMaterialization(
                asset_key=bronze_key(*ctx.relation.qualified),
                metadata=_bronze_events(ctx, report, before[ctx.relation.qualified], seconds)))
        for meta_name in META_TABLES:
            uri = lakehouse.internal(meta_name)
            context.log_event(dg.AssetMaterialization(
                asset_key=names.meta_key(meta_name), metadata=(
                _meta_table_events(meta_name, uri, report, meta_before[meta_name], seconds))))
        session = spark.lazy()
        health = slot_health(postgres.dsn, capture.slot)
        for name in dict.fromkeys(wanted.values()):
            ctx = by_name[name]
            version, bronze_from = _previous(context.instance, silver_key(*name))
            silver_before = table_stats(ctx.silver_uri, version) if version is not None \
                else TableStats(None)
            silver = apply_silver(ctx, session, settings.silver_spark_threshold_rows,
                                  settings.target_file_bytes)
            meta = _silver_metadata(silver, ctx, silver_before, bronze_from, health)
            meta["capture_kind"] = "incremental"
            context.log_event(dg.AssetMaterialization(asset_key=silver_key(*name),
                                                      metadata=meta))
        failed: list[str] = []
        per_key: dict[str, dict[str, Any]] = {}
        for key, (s, t) in wanted.items():
            p = store.load(s, t)
            meta = _partition_metadata(p, seconds)
            meta["silver_rows"] = live_row_count(by_name[(s, t)].silver_uri) or 0
            per_key[key] = meta
            if p is None or p.status != "done":
                failed.append(f"{key} is {meta['status']}")
        run_meta = {"tables_in_run": len(keys), "duration_s": round(seconds, 3),
                    "rows_emitted": report.rows_emitted, **stream_range(report)}
        if failed:
            for key, meta in per_key.items():
                if meta["status"] == "done":
                    context.log_event(dg.AssetMaterialization(
                        asset_key=incremental_key, partition=key,
                        metadata={**run_meta, **meta}))
            raise dg.Failure(
                "incremental snapshot not finished: " + "; ".join(failed) + ". Paused tables "
                "continue after a resume-snapshot signal; retry the partition to resume (or "
                "restart a stopped one).", metadata={"failed": ", ".join(failed)})
        for key, meta in per_key.items():
            context.add_asset_metadata(meta, partition_key=key)
        return dg.MaterializeResult(metadata=run_meta)

    job = dg.define_asset_job(
        names.scoped(INCREMENTAL_JOB), selection=dg.AssetSelection.assets(incremental_key),
        executor_def=dg.in_process_executor,
        tags={"pgcdc/job": INCREMENTAL_JOB,
              **({"pgcdc/capture": names.name} if names.name else {})},
        description="Incremental snapshot (DBLog) of the partitions' tables while the stream "
        "runs; backfill it from the incremental/snapshot asset to re-snapshot many tables.")
    return incremental_snapshot, job
