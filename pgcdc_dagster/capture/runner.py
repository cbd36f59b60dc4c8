"""One capture run as the Dagster assets drive it: snapshot when needed, windows, silver."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pgcdc_dagster.capture.captured import CapturedTables
from pgcdc_dagster.capture.faults import crash_point
from pgcdc_dagster.capture.settings import SNAPSHOT_MODES, CaptureSettings
from pgcdc_dagster.capture.silver_apply import BATCH_ROWS, SilverReport, apply_silver
from pgcdc_dagster.capture.snapshot import (
    SnapshotReport,
    load_captured,
    run_snapshot,
)
from pgcdc_dagster.capture.snapshot_modes import normalise_mode
from pgcdc_dagster.capture.stream import (
    CaptureSetLog,
    StreamReport,
    capture_set_log,
    record_capture_set,
    recreated_tables,
    run_windows,
    stale_tables,
)
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.lake.data_files import DEFAULT_TARGET_FILE_BYTES
from pgcdc_dagster.lake.delta import ensure_local_dir
from pgcdc_dagster.lake.disk_full import explains_full_disk
from pgcdc_dagster.lake.memory import release_unused
from pgcdc_dagster.lake.paths import is_local, slot_root
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.discovery import SkippedTable, current_database, nothing_to_capture
from pgcdc_dagster.postgres.privileges import check_capture_privileges, explains_privileges
from pgcdc_dagster.postgres.slot import ensure_publication, slot_info
from pgcdc_dagster.postgres.slot_lock import slot_guard
from pgcdc_dagster.spark.lazy import SparkLike

log = logging.getLogger(__name__)

__all__ = ["SNAPSHOT_MODES", "BronzeRun", "apply_silver_tables", "run_bronze", "run_silver",
           "select_contexts"]

SILVER_THREADS = 2
"""Tables whose silver catches up at the same time (the machine's cores, at most)."""


@dataclass
class BronzeRun:
    """What the bronze step did."""

    tables: CapturedTables
    """Every captured table (contexts built on use)."""
    names: list[tuple[str, str]]
    """The tables the run selected (``only``), in table order."""
    snapshot: SnapshotReport | None = None
    stream: StreamReport | None = None
    notes: list[str] = field(default_factory=list)
    skipped: list[SkippedTable] = field(default_factory=list)
    """Tables the include list matches that are left out (not capturable), with why."""
    resnapshot: list[TableContext] = field(default_factory=list)
    """Tables snapshotted again because they came back to the capture set."""

    def changed(self) -> list[TableContext]:
        """The contexts whose bronze this run wrote: snapshotted (with or without data),
        snapshotted again, or given stream events. Idle tables are not among them."""
        names: set[str] = set()
        if self.snapshot is not None:
            names.update(t.table for t in self.snapshot.tables)
            names.update(self.snapshot.empty_tables)
        names.update(c.name for c in self.resnapshot)
        if self.stream is not None:
            names.update(self.stream.events_by_table())
        selected = set(self.names)
        return [c for c in self.tables.named(names) if c.relation.qualified in selected]

    def current_silver(self) -> dict[str, SilverReport]:
        """The silver catch-up's report of each table whose silver this run's snapshot left
        at bronze's latest version and no window wrote since (nothing to apply: reading
        both tables again would find what the snapshot commit already knows)."""
        if self.snapshot is None:
            return {}
        streamed = self.stream.events_by_table() if self.stream is not None else {}
        return {t.table: SilverReport(t.table, t.bronze_version, t.bronze_version, 0, 0, {},
                                      t.silver_version, 0.0)
                for t in self.snapshot.tables if t.silver_current and t.table not in streamed}

    @property
    def contexts(self) -> list[TableContext]:
        """The selected tables' contexts: builds (opens) every one of them; a run that
        reports only what it changed uses :meth:`changed` and :attr:`names` instead."""
        return self.tables.contexts(set(self.names))


def select_contexts(settings: CaptureSettings,
                    only: Collection[tuple[str, str]] | None) -> list[TableContext]:
    """Contexts of the captured tables, restricted to ``only`` when given (the others are
    not built: their bronze is not opened)."""
    tables, _ = load_captured(settings)
    with tables:
        return tables.contexts(None if only is None else set(only))


@explains_privileges
@explains_full_disk
def run_bronze(settings: CaptureSettings, spark: SparkLike, *, force_snapshot_step: bool,
               only: Collection[tuple[str, str]] | None = None,
               progress: Callable[[str], None] = log.info,
               on_committed: Callable[[BronzeRun], None] | None = None,
               after_snapshot: Callable[[], None] | None = None) -> BronzeRun:
    """Snapshot if ``snapshot.mode`` asks for one, then read windows into bronze.

    The whole step holds the slot's lock (:mod:`pgcdc_dagster.postgres.slot_lock`; re-used
    when the calling thread holds it already, as a Dagster run does): a second reader gets
    :class:`~pgcdc_dagster.exceptions.SlotInUseError` before it reads or writes anything.

    The snapshot step runs first in every run (``capture/snapshot_modes.py`` has the rules):
    it takes the initial snapshot, snapshots tables that have no offset yet, finishes an
    interrupted snapshot, and, with ``force_snapshot_step`` and ``snapshot.mode = always``,
    snapshots every table again. It covers every captured table, whatever ``only`` selects,
    so that no table ever streams before its snapshot is committed.

    ``on_committed``: receives, as the snapshot step commits a batch of tables, the run as
    it stands with that batch as its snapshot (``tables``: the batch only; no stream yet):
    a caller reports them while the step goes on. Tables snapshotted again because they
    return to the capture set are in the finished run only. ``after_snapshot``: called when
    the snapshot step has ended, before anything else is read or written (that caller
    waits there until its reports are written: the stream's commits and slot moves must not
    show in what it reports as the snapshot's).
    """
    normalise_mode(settings.snapshot_mode)
    with slot_guard(settings.dsn, settings.slot):
        captured, skipped = load_captured(settings)
        if not captured.relations:
            raise nothing_to_capture(settings.include, skipped)
        with captured:  # the contexts' connection closed when the step ends
            return _run_bronze(settings, spark, force_snapshot_step, only, progress,
                               captured, skipped, on_committed, after_snapshot)


def _run_bronze(settings: CaptureSettings, spark: SparkLike, force_snapshot_step: bool,
                only: Collection[tuple[str, str]] | None,
                progress: Callable[[str], None], captured: CapturedTables,
                skipped: list[SkippedTable],
                on_committed: Callable[[BronzeRun], None] | None = None,
                after_snapshot: Callable[[], None] | None = None) -> BronzeRun:
    run = BronzeRun(captured, [n for n in captured.names if only is None or n in only],
                    skipped=skipped)
    if is_local(settings.lakehouse):  # unwritable: refused before the publication exists
        ensure_local_dir(slot_root(settings.lakehouse, settings.slot))
    with connection(settings.dsn) as conn:
        # Up front: REPLICATION and what the publication needs, every shortfall named.
        check_capture_privileges(conn, settings.publication, captured.relations,
                                 settings.publication_autocreate, prune=True)
        if settings.publication_autocreate == "filtered":
            # Debezium's filtered mode: the publication holds exactly the captured tables; a
            # table removed from the capture set leaves it (nothing decodes it for nothing).
            ensure_publication(conn, settings.publication, captured.relations,
                               "filtered", prune=True)

    def committed(part: SnapshotReport) -> None:
        if on_committed is not None:
            on_committed(dataclasses.replace(run, snapshot=part))

    run.snapshot = run_snapshot(settings, spark, force=force_snapshot_step, contexts=captured,
                                progress=progress,
                                on_committed=None if on_committed is None else committed)
    if after_snapshot is not None:
        after_snapshot()
    if run.snapshot.performed:
        progress(f"snapshot: {run.snapshot.rows} rows from {len(run.snapshot.tables)} tables "
                 f"at {run.snapshot.consistent_point} in {run.snapshot.seconds:.1f}s")
    elif force_snapshot_step and run.snapshot.reason:
        run.notes.append(run.snapshot.reason)
    if settings.snapshot_mode == "initial_only":
        run.notes.append("snapshot.mode = initial_only: no streaming")
        return run
    # Offsets as the contexts built so far read them, but for the tables this run's snapshot
    # committed: no bronze table is opened again to check for stale offsets.
    offsets = {name: c.offset for name, c in captured.built().items()}
    snapped = {ctx.relation.qualified for ctx in run.changed()}
    for name in snapped:
        offsets.pop(name, None)
    log_now = capture_set_log(settings)
    recreated = recreated_tables(log_now, captured.relations)
    run.resnapshot = resnapshot_returning_tables(settings, spark, captured, run, progress,
                                                 offsets, log_now)
    for ctx in run.resnapshot:
        offsets.pop(ctx.relation.qualified, None)
    with connection(settings.dsn) as conn:
        ident = SourceIdentity(settings.topic_prefix, current_database(conn))
    selected = captured if only is None else captured.subset(set(only))
    run.stream = run_windows(settings, selected, ident, offsets=offsets)
    progress(f"stream: {len(run.stream.windows)} windows, {run.stream.start} -> "
             f"{run.stream.end}, slot lag {run.stream.slot_lag_bytes} bytes")
    if recreated:
        run.resnapshot += resnapshot_recreated_tables(settings, spark, captured, recreated,
                                                      run, progress, snapped)
    return run


def resnapshot_recreated_tables(settings: CaptureSettings, spark: SparkLike,
                                captured: CapturedTables, recreated: Collection[tuple[str, str]],
                                run: BronzeRun, progress: Callable[[str], None],
                                snapped: Collection[tuple[str, str]] = ()
                                ) -> list[TableContext]:
    """Snapshot again the tables dropped and created again under their name (another
    relation OID than the capture-set log holds), after the windows that still held the
    dropped table's changes: those stay in bronze as they happened, and the snapshot, at a
    later point, replaces silver (the dropped table's rows, and the new table's rows written
    before it joined the publication, are in no change event). Then the log takes the new
    OIDs; a crash before that snapshots them again. Tables this run's snapshot step took
    (``snapped``: their bronze was moved aside, say) only get their new OID logged."""
    contexts = [captured[name] for name in recreated]
    again = [c for c in contexts if c.relation.qualified not in snapped]
    if again:
        names = ", ".join(c.name for c in again)
        progress(f"{names}: dropped and created again since the last run; snapshotting again")
        report = run_snapshot(dataclasses.replace(settings, snapshot_mode="always"), spark,
                              force=True, contexts=again, progress=progress)
        run.notes.append(f"re-snapshot of {names} (dropped and created again): {report.rows} "
                         f"rows at {report.consistent_point}")
    log_now: CaptureSetLog = capture_set_log(settings)
    with connection(settings.dsn) as conn:
        info = slot_info(conn, settings.slot)
    if log_now and info is not None and info.confirmed_flush_lsn is not None:
        _, tables, oids = log_now[-1]
        record_capture_set(settings, info.confirmed_flush_lsn, sorted(tables), log_now,
                           {**oids, **{c.relation.qualified: c.relation.oid for c in contexts}})
    return again


def resnapshot_returning_tables(settings: CaptureSettings, spark: SparkLike,
                                captured: Sequence[TableContext] | CapturedTables,
                                run: BronzeRun,
                                progress: Callable[[str], None],
                                offsets: Mapping[tuple[str, str], int | None] | None = None,
                                log: CaptureSetLog | None = None
                                ) -> list[TableContext]:
    """Snapshot again the tables that come back to the capture set after windows were read
    without them: their old offset would resume the stream past the changes made meanwhile.
    The new snapshot replaces their silver (rows deleted meanwhile leave it too).
    ``offsets``: current bronze offsets the caller knows (:func:`stale_tables`)."""
    with connection(settings.dsn) as conn:
        info = slot_info(conn, settings.slot)
    if info is None or info.confirmed_flush_lsn is None:
        return []
    stale = stale_tables(settings, captured, info.confirmed_flush_lsn, log, offsets=offsets)
    if not stale:
        return []
    names = ", ".join(c.name for c in stale)
    progress(f"{names}: back in the capture set after windows read without them; "
             "snapshotting them again")
    again = run_snapshot(dataclasses.replace(settings, snapshot_mode="always"), spark,
                         force=True, contexts=stale, progress=progress)
    run.notes.append(f"re-snapshot of {names} (re-added to the capture set): "
                     f"{again.rows} rows at {again.consistent_point}")
    return stale


def run_silver(settings: CaptureSettings, spark: SparkLike,
               only: Collection[tuple[str, str]] | None = None) -> list[SilverReport]:
    """Catch every selected table's silver up with its bronze.

    Tables are independent (one Delta table each, their own app transaction), so up to
    ``SILVER_THREADS`` of them catch up at once: reading Parquet, the Arrow preparation and
    the silver file rewrites release the GIL. Reports come back in the contexts' order.
    """
    return apply_silver_tables(select_contexts(settings, only), spark,
                               settings.silver_spark_threshold_rows, settings.target_file_bytes,
                               settings.silver_batch_rows)


def apply_silver_tables(contexts: Sequence[TableContext], spark: SparkLike,
                        threshold: int,
                        target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
                        batch_rows: int = BATCH_ROWS) -> list[SilverReport]:
    """:func:`apply_silver` for each context, ``SILVER_THREADS`` at a time (in order)."""

    def one(ctx: TableContext) -> SilverReport:
        report = apply_silver(ctx, spark, threshold, target_file_bytes, batch_rows)
        crash_point("after_silver_merge")
        release_unused()
        return report

    if len(contexts) < 2 or SILVER_THREADS < 2:
        return [one(ctx) for ctx in contexts]
    with ThreadPoolExecutor(min(SILVER_THREADS, len(contexts)),
                            thread_name_prefix="pgcdc-silver") as pool:
        return list(pool.map(one, contexts))
