"""The snapshot step: ``snapshot.mode``, lock-free consistent points, parallel chunks, resumption.

Consistent without locks (design.md §3, decision 7; SNAP-03..05, SNAP-17..20): every chunk
reader imports a snapshot exported at a slot's consistent point, inside a REPEATABLE READ
READ ONLY transaction; ``snapshot_modes`` explains where that point comes from (a new slot,
or a temporary slot next to the existing one) and why resuming at a later point is exact.

Parallel and bounded: tables are split into key ranges (CTID ranges without a key), each
chunk is a Spark task that COPYs its range (in key order) and writes one bronze Parquet file
and silver files of the target size, sorted by key (``spark/snapshot_tasks.py``); chunks
of small tables share a task. The driver records the finished chunks in the progress table
(``snapshot_state``; one append per batch of results) and, once all chunks of a table are
in, commits the table through delta-rs: one bronze append (``op = r`` events; the table's
offset = the smallest point its chunks were read at) and one silver **overwrite**, so a
re-snapshot replaces silver and never merges over it (keys deleted in between cannot survive
as phantom rows). Tables finished together are committed by a few
threads at once and recorded with one append (a thousand small tables cost little
more per table than their commits).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pgcdc_dagster.capture.captured import CapturedTables
from pgcdc_dagster.capture.faults import crash_point
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot_commit import (
    TableSnapshotReport,
    check_bronze_schema,
    commit_empty,
    commit_table,
    remove_uncommitted,
)
from pgcdc_dagster.capture.snapshot_modes import (
    SnapshotDecision,
    decide,
    normalise_mode,
    reusable_chunks,
)
from pgcdc_dagster.capture.snapshot_progress import ProgressTracker, SnapshotProgress
from pgcdc_dagster.capture.snapshot_state import (
    ChunkDone,
    SnapshotLog,
    SnapshotState,
    TableDone,
    TableName,
    TablePlan,
    progress_uri,
)
from pgcdc_dagster.capture.stream import last_capture_set
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.column_options import parse_column_options
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.typeconv import PgType
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.commit_safety import ensure_safe_commits
from pgcdc_dagster.lake.delta import committed_version, open_table
from pgcdc_dagster.lake.paths import is_local
from pgcdc_dagster.lake.storage import storage_options
from pgcdc_dagster.names import resolve_table_id, table_id
from pgcdc_dagster.postgres.catalog import column_facts, load_types
from pgcdc_dagster.postgres.chunk_plan import (
    TableSize,
    chunk_counts,
    key_columns,
    key_columns_of,
    plan_chunks,
    plan_key_chunks,
    table_size,
    table_sizes,
)
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.discovery import (
    SkippedTable,
    check_server,
    compile_patterns,
    current_database,
    leave_out_partitioned,
    resolve_capture,
)
from pgcdc_dagster.postgres.exported_snapshot import (
    ExportedPoint,
    create_plain_slot,
    published_tables,
    temporary_exported_snapshot,
)
from pgcdc_dagster.postgres.slot import (
    create_slot_with_snapshot,
    drop_slot,
    ensure_publication,
    slot_info,
)
from pgcdc_dagster.postgres.snapshot_override import validate_override
from pgcdc_dagster.postgres.snapshot_read import Chunk, KeyColumn, TableVanishedError, block_bytes
from pgcdc_dagster.spark.chunk_jobs import run_chunks, run_units_here
from pgcdc_dagster.spark.lazy import LazySpark, SparkLike
from pgcdc_dagster.spark.snapshot_tasks import (
    ChunkResult,
    ChunkTask,
    Unit,
    group_small,
)

if TYPE_CHECKING:
    import psycopg2.extensions

log = logging.getLogger(__name__)

COMMIT_THREADS = 4
"""Tables committed at once (delta-rs commits wait on storage more than on the CPU)."""
PROGRESS_EVERY_S = 5.0
"""A progress line for a chunk of a single-chunk table at most this often (each line is an
event in the Dagster run's log): chunks of tables read in several are each reported."""


@dataclass
class SnapshotReport:
    """Outcome of one snapshot step."""

    performed: bool
    consistent_point: Lsn | None
    """Where this run's chunks were read (the new slot's point, or a temporary slot's)."""
    tables: list[TableSnapshotReport] = field(default_factory=list)
    seconds: float = 0.0
    reason: str = ""
    mode: str = ""
    snapshot_id: int | None = None
    slot_action: str = "none"
    rows_read: int = 0
    """Rows read by this run (chunks kept from an interrupted run excluded)."""
    resumed_chunks: int = 0
    chunks_read: int = 0
    spark_tasks: int = 0
    """Spark tasks the chunks were read in (small tables' chunks share tasks; 0: read in
    this process, below ``snapshot_spark_threshold_rows``)."""
    estimated_rows: int = 0
    """Rows the tables to read hold by the catalog's estimate, when the step chose where to
    read them (Spark above ``snapshot_spark_threshold_rows``, this process otherwise)."""
    executors: list[str] = field(default_factory=list)
    """``host:pid`` of the Spark Python workers that read this run's chunks (empty: read in
    this process)."""
    empty_tables: list[str] = field(default_factory=list)
    """Tables given an offset without data (no_data, snapshot.include.collection.list)."""
    last_progress: SnapshotProgress | None = None
    timeline: list[tuple[str, float]] = field(default_factory=list)
    """What happened when, in seconds from the step's start, in order: ``spark start`` (the
    JVM's start asked for; negative when the run started it before the step), ``slot
    created`` (or ``snapshot point``: a temporary slot's), ``planned``, ``spark needed``,
    ``spark ready``, ``first chunk``, ``chunks read``, ``committed``."""

    _by_table: dict[str, TableSnapshotReport] = field(default_factory=dict, repr=False,
                                                       compare=False)

    def table(self, name: str) -> TableSnapshotReport | None:
        """The report of table ``name`` (``schema.table``), None when not committed here."""
        if len(self._by_table) != len(self.tables):
            self._by_table = {t.table: t for t in self.tables}
        return self._by_table.get(name)

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def rows_per_second(self) -> float:
        return self.rows_read / self.seconds if self.seconds > 0 else 0.0


def load_captured(settings: CaptureSettings) -> tuple[CapturedTables, list[SkippedTable]]:
    """Check the server and resolve the include list: the captured tables, whose contexts
    are built when first used (:class:`CapturedTables`), and the matched tables left out
    (not capturable: no key, UNLOGGED, no SELECT, ...)."""
    with connection(settings.dsn) as conn:
        check_server(conn)
        key_for = parse_column_options(tuple(settings.column_options)).key_for
        found = resolve_capture(conn, settings.include, settings.exclude, key_for=key_for)
        leave_out_partitioned(conn, found, settings.include, settings.plugin_name)
        # The catalog read in bulk (types, NOT NULL flags and defaults: a few queries for
        # every table); the schema history is read once when the first context is built.
        types: dict[int, PgType] = {}
        load_types(conn, {c.type_oid for r in found.relations for c in r.columns}, cache=types)
        facts = column_facts(conn, [r.oid for r in found.relations])
    return CapturedTables(settings, found.relations, types=types, facts=facts), found.skipped


def load_capture(settings: CaptureSettings) -> tuple[list[TableContext], list[SkippedTable]]:
    """:func:`load_captured` with every captured table's context built (their new schema
    history entries written in one append)."""
    tables, skipped = load_captured(settings)
    with tables:
        return tables.contexts(), skipped


def load_contexts(settings: CaptureSettings) -> list[TableContext]:
    """The captured tables' contexts (:func:`load_capture` without the skipped tables)."""
    return load_capture(settings)[0]


def has_offset(ctx: TableContext) -> bool:
    """True when bronze holds the table's offset (a committed snapshot or stream window)."""
    return committed_version(open_table(ctx.bronze_uri), ctx.bronze_app_id) is not None


snapshot_done = has_offset


def run_initial_snapshot(settings: CaptureSettings, spark: SparkLike) -> SnapshotReport:
    """The snapshot step as the initial_snapshot job runs it (``force``)."""
    return run_snapshot(settings, spark, force=True)


def run_snapshot(settings: CaptureSettings, spark: SparkLike, *, force: bool,
                 contexts: Sequence[TableContext] | CapturedTables | None = None,
                 progress: Callable[[str], None] = log.info,
                 on_progress: Callable[[SnapshotProgress], None] | None = None,
                 on_committed: Callable[[SnapshotReport], None] | None = None,
                 ) -> SnapshotReport:
    """Apply ``snapshot.mode`` and take (or finish) the snapshot it asks for.

    Args:
        settings: the capture.
        spark: the session whose executors read the chunks, or a :class:`LazySpark` handle:
            it is started (in the background) only when there are chunks to read.
        force: the snapshot step was asked for explicitly (``always`` re-snapshots then).
        contexts: the captured tables (loaded when None). Of :class:`CapturedTables`, only
            the tables the step snapshots are built (opened); the others' offsets are
            looked up without building them.
        progress: receives a log line after each chunk and at each step.
        on_progress: receives the structured progress after each chunk.
        on_committed: receives, after each batch of tables is committed (bronze and silver)
            and recorded in the progress table, a copy of the report as it stands then
            whose ``tables`` are that batch only (a caller reports them while the other
            tables are still read). Called on this thread; what it raises stops the step.

    Raises:
        SlotLostError: the mode cannot continue without the lost slot's changes.
        ConfigurationError: a bad override, an unpublished table, a vanished table
            (``TableVanishedError``, after the other tables were committed).
        UnsupportedTypeError: a value the configured handling mode cannot convert.
    """
    tables = CapturedTables.of(contexts, settings) if contexts is not None \
        else load_captured(settings)[0]
    try:
        return _SnapshotRun(settings, spark, tables, progress, on_progress,
                            on_committed).execute(force)
    finally:
        if contexts is None:
            tables.close()


def _fingerprint(ctx: TableContext, override: str | None) -> str:
    """What chunks of one plan must share: the schemas they were written with, the SELECT."""
    data = ctx.bronze_schema.serialize().to_pybytes() + ctx.silver_schema.serialize().to_pybytes()
    return hashlib.sha1(data + (override or "").encode()).hexdigest()[:16]


class _SnapshotRun:
    """One snapshot step (state shared by its phases)."""

    def __init__(self, settings: CaptureSettings, spark: SparkLike,
                 contexts: CapturedTables, progress: Callable[[str], None],
                 on_progress: Callable[[SnapshotProgress], None] | None,
                 on_committed: Callable[[SnapshotReport], None] | None = None) -> None:
        self.settings = settings
        self.spark = LazySpark.of(spark)
        self.contexts = contexts
        self.order = list(contexts.names)
        self.progress = progress
        self.on_progress = on_progress
        self.on_committed = on_committed
        self.mode = normalise_mode(settings.snapshot_mode)
        self.log = SnapshotLog(progress_uri(settings.lakehouse, settings.slot))
        self.started = time.monotonic()
        self.ident = SourceIdentity(settings.topic_prefix, "")
        self.overrides: dict[TableName, str] = {}
        self.keys: dict[TableName, list[KeyColumn]] = {}
        self.marks: list[tuple[str, float]] = [("step start", self.started)]
        self.use_spark = True
        """False: the chunks are read on threads of this process (a small snapshot)."""

    def _mark(self, event: str) -> None:
        self.marks.append((event, time.monotonic()))

    def _timeline(self) -> list[tuple[str, float]]:
        """The marks and the Spark session's start and readiness, from the step's start."""
        marks = list(self.marks) + self.spark.timeline()
        return [(event, round(at - self.started, 3))
                for event, at in sorted(marks, key=lambda m: m[1])]

    # --- preparation --------------------------------------------------------------------

    def _snapshot_include(self) -> set[TableName] | None:
        patterns = compile_patterns(self.settings.snapshot_include,
                                    "snapshot.include.collection.list")
        if not patterns:
            return None
        return {t for t in self.order if any(re.fullmatch(p, f"{t[0]}.{t[1]}")
                                             for p in patterns)}

    def _prepare(self, conn: psycopg2.extensions.connection) -> None:
        """Publication, overrides and the source identity (before any slot is created)."""
        relations = self.contexts.relations
        ensure_publication(conn, self.settings.publication, relations,
                           self.settings.publication_autocreate)
        published = published_tables(conn, self.settings.publication)
        if published is not None:
            missing = [f"{s}.{t}" for s, t in self.order if (s, t) not in published]
            if missing:
                raise ConfigurationError(
                    f"publication {self.settings.publication!r} does not publish "
                    f"{', '.join(missing)}, so their changes after the snapshot would be lost. "
                    "Add them (ALTER PUBLICATION ... ADD TABLE) or set "
                    "publication.autocreate.mode = filtered.")
        self.ident = SourceIdentity(self.settings.topic_prefix, current_database(conn))
        for name, select in self.settings.snapshot_select_overrides:
            try:
                schema, table = resolve_table_id(name, self.contexts)
            except ValueError as exc:
                raise ConfigurationError(f"snapshot.select.statement.overrides: {exc}") from None
            ctx = self.contexts.get((schema, table))
            if ctx is None:
                raise ConfigurationError(
                    f"snapshot.select.statement.overrides names {name!r}, which is not a "
                    "captured table (use schema.table of a table in table.include.list)")
            cols = [(c.name, c.type_oid) for c in ctx.relation.columns]
            self.overrides[(schema, table)] = validate_override(
                conn, schema, table, select, cols,
                timeout_ms=self.settings.incremental_statement_timeout_ms)

    # --- the step -----------------------------------------------------------------------

    def execute(self, force: bool) -> SnapshotReport:
        with connection(self.settings.dsn) as conn:
            self._prepare(conn)
            slot = slot_info(conn, self.settings.slot)
        # A context's offset, once set, only grows: open bronze only for tables without one
        # (none for a table the last windows were read for).
        offsets = {name: self.contexts.has_offset(name, lambda: last_capture_set(self.settings))
                   for name in self.order}
        open_state = self.log.load_open()
        decision = decide(self.mode, force=force, slot=slot, slot_name=self.settings.slot,
                          tables=self.order, offsets=offsets, open_snapshot=open_state,
                          snapshot_include=self._snapshot_include())
        report = SnapshotReport(False, None, reason=decision.reason, mode=self.mode,
                                slot_action=decision.slot_action)
        if decision.abandon is not None:
            self._abandon(decision.abandon, decision.reason)
        if not decision.performed:
            report.seconds = time.monotonic() - self.started
            return report
        self.progress(f"snapshot ({self.mode}): {decision.reason}")
        chosen = decision.tables + decision.empty_tables + (
            tuple(decision.resume.tables) if decision.resume is not None else ())
        # Their contexts built together (one schema-history append), no idle table's.
        self.contexts.build([n for n in dict.fromkeys(chosen) if n in self.contexts])
        if decision.slot_action == "create_plain":
            with connection(self.settings.dsn) as conn:
                created_at = create_plain_slot(conn, self.settings.slot,
                                               self.settings.plugin_name,
                                               failover=self.settings.slot_failover)
            return self._empty_only(decision, created_at, report)
        if decision.slot_action == "none":
            assert slot is not None and slot.confirmed_flush_lsn is not None
            return self._empty_only(decision, int(slot.confirmed_flush_lsn), report)
        # Chunks to read: above the threshold, Spark and its Python workers start in the
        # background while the slot is created, the chunks planned and the tables prepared;
        # a small snapshot reads its chunks in this process and never starts Spark.
        report.estimated_rows = self._estimated_rows(decision)
        self.use_spark = report.estimated_rows > self.settings.snapshot_spark_threshold_rows
        if self.use_spark:
            self.spark.start(on_ready=LazySpark.warm)
        else:
            self.progress(f"snapshot of ~{report.estimated_rows:,} rows (at most "
                          f"snapshot_spark_threshold_rows "
                          f"{self.settings.snapshot_spark_threshold_rows:,}): read in this "
                          "process, without Spark")
        with self._point(decision) as (point, stream_from):
            return self._read(decision, point, stream_from, report)

    @contextmanager
    def _point(self, decision: SnapshotDecision) -> Iterator[tuple[ExportedPoint, int]]:
        """The exported snapshot to read in, and the lowest point the stream will deliver."""
        slot = self.settings.slot
        if decision.slot_action == "recreate":
            with connection(self.settings.dsn) as conn:
                drop_slot(conn, slot)
            self.progress(f"dropped the invalidated slot {slot!r}")
        if decision.slot_action in ("create", "recreate"):
            with create_slot_with_snapshot(self.settings.dsn, slot, self.settings.plugin_name,
                                           report=self.progress,
                                           failover=self.settings.slot_failover) as exported:
                self._mark("slot created")
                self.progress(f"slot {slot!r} created at {exported.consistent_point}")
                point = int(exported.consistent_point)
                yield ExportedPoint(exported.name, point, exported.snapshot_name), point
            return
        temp = f"{slot}_snap_{int(time.time() * 1000) % 10**10}"[:63]
        with temporary_exported_snapshot(self.settings.dsn, temp) as exported:
            stream_from = exported.lsn
            if self.mode != "initial_only":
                with connection(self.settings.dsn) as conn:
                    info = slot_info(conn, slot)
                if info is None or info.confirmed_flush_lsn is None:
                    raise ConfigurationError(f"slot {slot!r} disappeared during the snapshot")
                stream_from = int(info.confirmed_flush_lsn)
                if stream_from > exported.lsn:
                    raise ConfigurationError(
                        f"slot {slot!r} is confirmed at {info.confirmed_flush_lsn}, past the "
                        f"snapshot point {Lsn(exported.lsn)}; this cannot happen unless the "
                        "slot was advanced concurrently")
            self._mark("snapshot point")
            self.progress(f"snapshot point {Lsn(exported.lsn)} (temporary slot; slot {slot!r} "
                          f"streams from {Lsn(stream_from)})")
            yield exported, stream_from

    # --- planning -----------------------------------------------------------------------

    def _plans(self, conn: psycopg2.extensions.connection,
               names: Sequence[TableName]) -> list[TablePlan]:
        """Plans of the tables, their chunk counts chosen together (:func:`chunk_counts`)."""
        found = self._sizes(conn, names)
        sizes = [found[name] for name in names]
        self._keys(conn, names)
        counts = chunk_counts([s.bytes for s in sizes], self.settings.snapshot_chunk_bytes,
                              self._slots())
        return [self._plan(conn, name, size, count)
                for name, size, count in zip(names, sizes, counts, strict=True)]

    @staticmethod
    def _sizes(conn: psycopg2.extensions.connection, names: Sequence[TableName]
               ) -> dict[TableName, TableSize]:
        """Every table's size in one query (one not found raises :func:`table_size`'s
        error)."""
        found = table_sizes(conn, names)
        for name in names:
            if name not in found:
                found[name] = table_size(conn, *name)
        return found

    def _keys(self, conn: psycopg2.extensions.connection, names: Sequence[TableName]) -> None:
        """Every table's key columns in one query."""
        missing = [n for n in names if n not in self.keys]
        self.keys.update(key_columns_of(conn, missing))

    def _plan(self, conn: psycopg2.extensions.connection, name: TableName, size: TableSize,
              count: int) -> TablePlan:
        ctx = self.contexts[name]
        schema, table = name
        key = self._key(conn, name)
        captured = {c.name for c in ctx.relation.columns}
        if key and (name not in self.overrides or {k.name for k in key} <= captured):
            chunks = plan_key_chunks(conn, schema, table, key, count, size)
            kind = "key"
        elif name in self.overrides:  # ranges need the key among the override's columns
            chunks, kind = [Chunk(schema, table, 0, "key")], "key"
        else:
            per_chunk = max(1, -(-size.blocks // count))
            chunks, kind = plan_chunks(schema, table, size.blocks, per_chunk), "ctid"
        return TablePlan(schema, table, kind, chunks, size.est_rows, name in self.overrides,
                         _fingerprint(ctx, self.overrides.get(name)),
                         key=[k.name for k in key] if kind == "key" else [])

    def _estimated_rows(self, decision: SnapshotDecision) -> int:
        """Rows of the tables the step reads, by the catalog's estimate (heap bytes / 128
        for a table never analysed); a resumed snapshot counts its tables whole."""
        names = list(dict.fromkeys(decision.tables + (
            tuple(decision.resume.tables) if decision.resume is not None else ())))
        with connection(self.settings.dsn) as conn:
            sizes = table_sizes(conn, names)
        return sum(s.est_rows if s.est_rows >= 0 else s.bytes // 128 for s in sizes.values())

    def _slots(self) -> int:
        """Chunks read at once: the Spark session's task slots (a local master's known
        without Spark), or the CPUs of this process when it reads them itself; at most
        ``snapshot_max_threads``."""
        slots = self.spark.parallelism() if self.use_spark else (os.cpu_count() or 1)
        threads = self.settings.snapshot_max_threads
        return min(slots, threads) if threads > 0 else slots

    def _key(self, conn: psycopg2.extensions.connection, name: TableName) -> list[KeyColumn]:
        if name not in self.keys:
            self.keys[name] = key_columns(conn, name[0], name[1])
        return self.keys[name]

    # --- reading ------------------------------------------------------------------------

    def _read(self, decision: SnapshotDecision, point: ExportedPoint, stream_from: int,
              report: SnapshotReport) -> SnapshotReport:
        report.consistent_point = Lsn(point.lsn)
        with connection(self.settings.dsn) as conn:
            state, kept = self._state(conn, decision, stream_from)
            planned = [n for n in state.plans if n in self.contexts]
            sizes = self._sizes(conn, planned)
            self._keys(conn, planned)
        report.snapshot_id = state.snapshot_id
        report.resumed_chunks = sum(len(c) for c in kept.values())
        tables = [n for n in state.tables if n in state.plans and n in self.contexts
                  and n not in state.committed and n not in state.vanished]
        tasks = self._tasks(state, tables, kept, point, sizes)
        self._mark("planned")
        est = sum(max(state.plans[n].est_rows, 0) for n in tables)
        tracker = ProgressTracker(state.snapshot_id, sum(len(state.plans[n].chunks)
                                                         for n in tables), est,
                                  chunks_done=report.resumed_chunks,
                                  rows_done=sum(c.rows for d in kept.values()
                                                for c in d.values()))
        done: dict[TableName, dict[int, ChunkDone]] = {n: dict(kept.get(n, {})) for n in tables}
        vanished: dict[TableName, str] = {}
        fatal: list[Exception] = []
        fresh: list[tuple[TablePlan, ChunkDone]] = []  # read, not yet in the progress table
        ready: list[TableName] = []  # every chunk in, not yet committed
        recorded = [0]
        last_line = [0.0]

        def proceed(task: ChunkTask) -> bool:
            return not fatal and task.chunk.qualified not in vanished

        def on_result(result: ChunkResult) -> None:
            name = result.chunk.qualified
            if result.error is not None:
                exc = result.error.exception()
                if isinstance(exc, TableVanishedError):
                    if name not in vanished:
                        vanished[name] = str(exc)
                        self.log.vanished(state.snapshot_id, name, str(exc))
                elif not fatal:
                    fatal.append(exc)
                return
            plan = state.plans[name]
            chunk_done = ChunkDone(result.chunk.index, result.lsn, result.rows, result.bronze,
                                   result.silver)
            if not report.chunks_read:
                self._mark("first chunk")
            if result.executor and result.executor not in report.executors:
                report.executors.append(result.executor)
            fresh.append((plan, chunk_done))
            done[name][chunk_done.index] = chunk_done
            report.rows_read += result.rows
            report.chunks_read += 1
            info = tracker.add(table_id(*name), result.rows)
            report.last_progress = info
            now = time.monotonic()
            if len(plan.chunks) > 1 or info.chunks_done >= info.chunks_total or \
                    now - last_line[0] >= PROGRESS_EVERY_S:
                last_line[0] = now
                self.progress(info.message())
            if self.on_progress is not None:
                self.on_progress(info)
            if len(done[name]) == len(plan.chunks):
                ready.append(name)

        def drained() -> None:
            """Record the chunks received (one append), then commit the finished tables."""
            if fresh:
                self.log.chunks_done(state.snapshot_id, fresh)
                fresh.clear()
                for n in range(recorded[0] + 1, report.chunks_read + 1):
                    crash_point(f"snapshot_after_chunk_{n}")
                recorded[0] = report.chunks_read
            if ready:
                batch = self._commit_many(state, ready, done, kept, pool)
                report.tables.extend(batch)
                ready.clear()
                if self.on_committed is not None:
                    self.on_committed(dataclasses.replace(
                        report, performed=True, tables=batch, _by_table={},
                        seconds=time.monotonic() - self.started))

        with ThreadPoolExecutor(COMMIT_THREADS, thread_name_prefix="pgcdc-commit") as pool:
            # complete before this run (crash before their commit)
            ready.extend(n for n in tables if len(done[n]) == len(state.plans[n].chunks))
            drained()
            if tasks and self.use_spark:  # the first Spark job: wait for the session now
                self._mark("spark needed")
                report.spark_tasks = run_chunks(
                    self.spark, tasks, on_result,
                    parallelism=self.settings.snapshot_max_threads, proceed=proceed,
                    on_drained=drained)
                self._mark("chunks read")
            elif tasks:
                run_units_here(tasks, on_result, parallelism=self._slots(), proceed=proceed,
                               on_drained=drained)
                self._mark("chunks read")
            drained()
            self._mark("committed")
        if fatal:
            raise fatal[0]
        for name in decision.empty_tables:
            report.empty_tables.append(self._commit_empty(name, point.lsn))
        self.log.finish(state.snapshot_id, "done")
        report.performed = True
        report.seconds = time.monotonic() - self.started
        self.progress(f"snapshot {state.snapshot_id} done: {report.rows:,} rows in "
                      f"{len(report.tables)} tables, {report.rows_per_second:,.0f} rows/s")
        report.timeline = self._timeline()
        self.progress("snapshot timeline (s from the step's start): " + ", ".join(
            f"{event} {at:.2f}" for event, at in report.timeline))
        if vanished:
            raise TableVanishedError("; ".join(vanished.values()))
        return report

    def _state(self, conn: psycopg2.extensions.connection, decision: SnapshotDecision,
               stream_from: int) -> tuple[SnapshotState, dict[TableName, dict[int, ChunkDone]]]:
        """The snapshot to work on (new, or the open one extended) and the chunks to keep."""
        kept: dict[TableName, dict[int, ChunkDone]] = {}
        if decision.resume is None:
            snapshot_id = int(time.time() * 1000)
            plans = self._plans(conn, decision.tables)
            self.log.start(snapshot_id, self.mode, decision.reason, plans)
            state = SnapshotState(snapshot_id, self.mode, [p.name for p in plans],
                                  {p.name: p for p in plans})
            return state, kept
        state = decision.resume
        extra = self._plans(conn, [n for n in decision.tables if n not in state.plans])
        if extra:
            self.log.add_plans(state.snapshot_id, extra)
            for p in extra:
                state.plans[p.name] = p
                state.tables.append(p.name)
        for name, plan in state.plans.items():
            ctx = self.contexts.get(name)
            if ctx is None or name in state.committed:
                continue
            chunks = state.chunks.get(name, {})
            key = [k.name for k in self._key(conn, name)] if plan.kind == "key" else []
            if plan.fingerprint != _fingerprint(ctx, self.overrides.get(name)) or \
                    (plan.key and plan.key != key):
                self.progress(f"{name[0]}.{name[1]}: its columns, key, handling modes or "
                              "SELECT override changed since the interrupted run; reading it "
                              "again")
                state.plans[name] = self._plans(conn, [name])[0]
                self.log.add_plans(state.snapshot_id, [state.plans[name]])
                continue
            kept[name] = reusable_chunks(plan, chunks, stream_from)
        return state, kept

    def _tasks(self, state: SnapshotState, tables: Sequence[TableName],
               kept: dict[TableName, dict[int, ChunkDone]], point: ExportedPoint,
               sizes: dict[TableName, TableSize]) -> list[Unit]:
        """The Spark tasks: each chunk to read, small tables' chunks grouped."""
        tasks: list[ChunkTask] = []
        small: list[int] = []  # heap bytes of a single-chunk table, -1 for the others
        now_ms = int(time.time() * 1000)
        order = [n for n in state.tables if n in state.plans]  # markers follow the plan
        positions = {n: i for i, n in enumerate(order)}
        for name in tables:
            pos = positions[name]
            ctx = self.contexts[name]
            plan = state.plans[name]
            check_bronze_schema(ctx)  # fail before reading, not at the commit
            for root in (ctx.bronze_uri, ctx.silver_uri):  # the tables exist from the commit
                ensure_safe_commits(root)  # refuse an unsafe store before reading anything
                if is_local(root):
                    os.makedirs(root, exist_ok=True)
            size = sizes[name]
            fetch = block_bytes(self.settings.snapshot_fetch_size, size.row_bytes)
            first = "first" if pos == 0 else "first_in_data_collection"
            last = "last" if pos == len(order) - 1 else "last_in_data_collection"
            final = len(plan.chunks) - 1
            schemas = (ctx.bronze_schema, ctx.silver_schema)  # built per access: once here
            storage = storage_options(ctx.bronze_uri)
            for chunk in plan.chunks:
                if chunk.index in kept.get(name, {}):
                    continue
                tasks.append(ChunkTask(
                    self.settings.dsn, point.snapshot_name, chunk, ctx.relation,
                    ctx.converters, *schemas,
                    tuple(self.keys.get(name, ())), self.overrides.get(name), ctx.bronze_uri,
                    ctx.silver_uri, self.ident, point.lsn, now_ms,
                    first_marker=first if chunk.index == 0 else None,
                    last_marker=last if chunk.index == final else None,
                    block_size=fetch, file_prefix=f"snap{state.snapshot_id}",
                    binary=self.settings.snapshot_binary,
                    statement_timeout_ms=self.settings.incremental_statement_timeout_ms
                    if name in self.overrides else 0,
                    storage=storage, silver_file_bytes=self.settings.target_file_bytes))
                small.append(size.bytes if len(plan.chunks) == 1 else -1)
        return group_small(tasks, small, chunk_bytes=self.settings.snapshot_chunk_bytes,
                           slots=self._slots())

    # --- committing ---------------------------------------------------------------------

    def _commit_many(self, state: SnapshotState, names: Sequence[TableName],
                     done: dict[TableName, dict[int, ChunkDone]],
                     kept: dict[TableName, dict[int, ChunkDone]],
                     pool: ThreadPoolExecutor) -> list[TableSnapshotReport]:
        """Commit the tables (a few at once), then record them with one append; their
        chunk records are dropped (the driver holds nothing per committed table but its
        report)."""
        def commit(name: TableName) -> TableSnapshotReport:
            return commit_table(self.contexts[name], done[name],
                                app_prefix=self.settings.app_prefix,
                                snapshot_id=state.snapshot_id, mode=self.mode,
                                resumed=len(kept.get(name, {})))

        reports = [commit(names[0])] if len(names) == 1 else list(pool.map(commit, names))
        self.log.tables_done(state.snapshot_id, [
            TableDone(name, r.lsn, r.rows, r.bronze_version, r.silver_version)
            for name, r in zip(names, reports, strict=True)])
        for name, r in zip(names, reports, strict=True):
            done.pop(name, None)
            log.debug("%s: %s rows committed (bronze v%s, silver v%s replaced), offset %s",
                      r.table, f"{r.rows:,}", r.bronze_version, r.silver_version, Lsn(r.lsn))
        if len(reports) == 1:
            r = reports[0]
            self.progress(f"{r.table}: {r.rows:,} rows committed (bronze v{r.bronze_version}, "
                          f"silver v{r.silver_version} replaced), offset {Lsn(r.lsn)}")
        else:
            self.progress(f"{len(reports)} tables committed ({sum(r.rows for r in reports):,} "
                          f"rows): {', '.join(r.table for r in reports[:5])}"
                          f"{', ...' if len(reports) > 5 else ''}")
        return reports

    def _commit_empty(self, name: TableName, point: int) -> str:
        commit_empty(self.contexts[name], point, self.mode)
        return self.contexts[name].name

    def _empty_only(self, decision: SnapshotDecision, point: int,
                    report: SnapshotReport) -> SnapshotReport:
        for name in decision.empty_tables:
            report.empty_tables.append(self._commit_empty(name, point))
        report.performed = bool(report.empty_tables) or decision.slot_action == "create_plain"
        report.consistent_point = Lsn(point)
        report.seconds = time.monotonic() - self.started
        return report

    def _abandon(self, state: SnapshotState, reason: str) -> None:
        """Close an open snapshot that cannot be finished; remove its uncommitted files."""
        self.log.finish(state.snapshot_id, "abandoned", reason)
        for name, chunks in state.chunks.items():
            if name in self.contexts and name not in state.committed:
                remove_uncommitted(self.contexts[name], chunks)
        self.progress(f"abandoned snapshot {state.snapshot_id}: {reason}")


__all__ = ["SnapshotReport", "TableSnapshotReport", "load_contexts", "run_initial_snapshot",
           "run_snapshot"]
