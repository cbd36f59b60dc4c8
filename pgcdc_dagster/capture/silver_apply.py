"""Silver catch-up: apply the bronze rows appended since silver last caught up.

Silver records, as its app transaction, the bronze table version it has applied through;
the files added to bronze after that version are the batch. Because the MERGE is
order-independent (greatest sequence wins, tombstones), replaying a batch is harmless.

A backlog of more than ``batch_rows`` bronze rows catches up in batches of whole bronze
versions (a single version above the budget: in groups of its files), each merged and
committed with the bronze version it reaches before the next is read: memory follows the
batch, not the backlog, and a run that dies resumes from the last committed batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa

from pgcdc_dagster.capture.faults import crash_point
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.silver_batch import INPUT_COLUMNS, SOURCE_FIELDS, prepare_arrow
from pgcdc_dagster.lake.bronze_read import read_files
from pgcdc_dagster.lake.data_files import DEFAULT_TARGET_FILE_BYTES
from pgcdc_dagster.lake.delta import committed_version, ensure_table, load_table, new_files
from pgcdc_dagster.lake.disk_full import explaining_full_disk
from pgcdc_dagster.lake.memory import release_unused
from pgcdc_dagster.lake.silver import merge_batch, silver_from_images
from pgcdc_dagster.lake.silver_lookup import resolve_lookups
from pgcdc_dagster.lake.storage import storage_options
from pgcdc_dagster.spark.lazy import SparkLike, session_of
from pgcdc_dagster.spark.silver_batch import prepare


@dataclass
class SilverReport:
    """Outcome of one silver catch-up of one table."""

    table: str
    bronze_from: int | None
    bronze_to: int
    events: int
    rows: int
    counts: dict[str, int]
    silver_version: int
    seconds: float


SPARK_THRESHOLD_ROWS = 2_000_000
"""Batches larger than this are prepared by Spark; smaller ones in Arrow on the driver,
where Spark's fixed cost per job (seconds on local[2]) would dominate."""
BATCH_ROWS = 1_000_000
"""Bronze rows of one silver batch; a larger backlog catches up in several."""


def apply_silver(ctx: TableContext, spark: SparkLike,
                 spark_threshold_rows: int = SPARK_THRESHOLD_ROWS,
                 target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
                 batch_rows: int = BATCH_ROWS) -> SilverReport:
    """Bring the table's silver up to its bronze's current version.

    ``spark`` (a session, or a :class:`LazySpark` handle that starts only now) prepares the
    batch only when it has more than ``spark_threshold_rows`` rows; silver's new files aim
    at ``target_file_bytes``. A full lakehouse filesystem raises
    :class:`~pgcdc_dagster.exceptions.LakehouseFullError` naming the silver table.
    """
    with explaining_full_disk(ctx.silver_uri):
        return _apply_silver(ctx, spark, spark_threshold_rows, target_file_bytes,
                             max(1, batch_rows))


def _file_rows(uri: str) -> dict[str, int]:
    """Rows per data file (by base name), from the Delta log's statistics."""
    actions = pa.table(load_table(uri).get_add_actions(flatten=True)).to_pydict()
    return {path.rsplit("/", 1)[-1]: int(n or 0)
            for path, n in zip(actions["path"], actions["num_records"], strict=True)}


def silver_batches(uri: str, applied: int | None, target: int, files: list[str],
                   batch_rows: int, rows: dict[str, int]) -> list[tuple[int, list[str]]]:
    """``(bronze version the batch reaches, its files)`` in order: one batch when the
    backlog fits ``batch_rows``; else whole bronze versions up to the budget each, and a
    version above it alone in groups of files, where only the last group reaches the
    version (the others record the version before it: replaying them is harmless).
    ``rows``: rows per file base name (:func:`_file_rows`)."""
    if sum(rows.get(f.rsplit("/", 1)[-1], 0) for f in files) <= batch_rows:
        return [(target, files)]
    out: list[tuple[int, list[str]]] = []
    reached = -1 if applied is None else applied
    pending: list[str] = []
    pending_rows = 0
    for version in range(reached + 1, target + 1):
        added = new_files(uri, version - 1, version)
        added_rows = sum(rows.get(f.rsplit("/", 1)[-1], 0) for f in added)
        if pending and pending_rows + added_rows > batch_rows:
            out.append((version - 1, pending))
            reached, pending, pending_rows = version - 1, [], 0
        if added_rows > batch_rows and reached >= 0:  # one version alone, in groups
            group: list[str] = []
            group_rows = 0
            for f in added:
                n = rows.get(f.rsplit("/", 1)[-1], 0)
                if group and group_rows + n > batch_rows:
                    out.append((reached, group))
                    group, group_rows = [], 0
                group.append(f)
                group_rows += n
            out.append((version, group))
            reached = version
            continue
        pending += added
        pending_rows += added_rows
    if pending or not out or out[-1][0] != target:
        out.append((target, pending))
    return out


def _apply_silver(ctx: TableContext, spark: SparkLike, spark_threshold_rows: int,
                  target_file_bytes: int, batch_rows: int) -> SilverReport:
    started = time.monotonic()
    # A table that joined the capture after the initial snapshot has an empty bronze until
    # its first change (or an incremental snapshot) arrives.
    bronze = ensure_table(ctx.bronze_uri, ctx.bronze_schema)
    silver = ensure_table(ctx.silver_uri, ctx.silver_schema)
    applied = committed_version(silver, ctx.silver_app_id)
    target = bronze.version()
    if applied is not None and applied >= target:
        return SilverReport(ctx.name, applied, target, 0, 0, {}, silver.version(),
                            time.monotonic() - started)
    files = new_files(ctx.bronze_uri, applied, target)
    schema = pa.schema(bronze.schema().to_arrow())
    events = rows_total = 0
    counts: dict[str, int] = {}
    file_rows = _file_rows(ctx.bronze_uri) if files else {}
    for reached, batch_files in silver_batches(ctx.bronze_uri, applied, target, files,
                                               batch_rows, file_rows):
        meta = {"pgcdc.kind": "silver", "pgcdc.bronze_version": str(reached)}
        batch_rows_read = sum(file_rows.get(f.rsplit("/", 1)[-1], 0) for f in batch_files)
        n_events, n_rows, batch_counts = _apply_batch(
            ctx, spark, batch_files, schema, reached, meta,
            batch_rows_read > spark_threshold_rows, target_file_bytes)
        events += n_events
        rows_total += n_rows
        for key, value in batch_counts.items():
            counts[key] = counts.get(key, 0) + value
        if reached != target:
            crash_point("after_silver_batch")
            release_unused()
    return SilverReport(ctx.name, applied, target, events, rows_total, counts,
                        ensure_table(ctx.silver_uri, ctx.silver_schema).version(),
                        time.monotonic() - started)


def _apply_batch(ctx: TableContext, spark: SparkLike, files: list[str], schema: pa.Schema,
                 target: int, meta: dict[str, str], with_spark: bool,
                 target_file_bytes: int) -> tuple[int, int, dict[str, int]]:
    """Merge the events of ``files`` into silver, recording bronze version ``target``."""
    if not files:
        counts = merge_batch(ctx.silver_uri, ctx.silver_schema.empty_table(),
                             pa.array([], pa.list_(pa.string())), relation=ctx.relation,
                             toastable=ctx.toastable, app_id=ctx.silver_app_id, version=target,
                             truncate_seq=None, metadata=meta)
        return 0, 0, counts
    if with_spark:
        read = pa.schema([schema.field(c) for c in INPUT_COLUMNS])
        batch = prepare(session_of(spark), files, ctx.relation.key_names, ctx.toastable, read,
                        storage_options(ctx.bronze_uri))
    else:
        batch = prepare_arrow(read_files(files, schema, INPUT_COLUMNS, SOURCE_FIELDS),
                              ctx.relation.key_names, ctx.toastable)
    rows = batch.rows
    image = rows.column("image").combine_chunks()
    meta_cols = {name: rows.column(name).combine_chunks()
                 for name in ("__lsn", "__commit_lsn", "__ordinal", "__source_ts_ms")}
    converters = ctx.silver_converters()
    silver_rows = silver_from_images(image, rows.column("op").combine_chunks(), meta_cols,
                                     ctx.relation, converters)
    unchanged = rows.column("__toast_unchanged").combine_chunks()
    if batch.lookups:  # primary-key changes whose TOAST values only silver holds
        silver_rows, unchanged = resolve_lookups(
            ctx.silver_uri, silver_rows, unchanged, batch.lookups, relation=ctx.relation,
            converters=converters,
            silver_names={c.bronze_field.name: c.silver_field.name for c in converters},
            table=ctx.name)
    counts = merge_batch(ctx.silver_uri, silver_rows, ctx.silver_names(unchanged),
                         relation=ctx.relation, toastable=ctx.silver_toastable,
                         app_id=ctx.silver_app_id, version=target,
                         truncate_seq=batch.truncate_seq, metadata=meta,
                         target_file_bytes=target_file_bytes)
    return batch.events, rows.num_rows, counts
