"""Incremental snapshots (DBLog) while the stream runs, and the signals that drive them.

One run holds the slot (the ``pgcdc_slot`` pool) and reads windows itself through
:func:`run_windows` with a hook. Per chunk: emit the low watermark (own transaction), read
the chunk (``postgres.chunks``: key order, READ ONLY, COPY text), emit the high watermark
(own transaction); then the hook feeds every window to the chunk's
:class:`~pgcdc_dagster.cdc.dblog.ChunkWindow`, which drops rows changed in the window and, in
the window holding the high watermark, adds the survivors (``op = r``,
``source.snapshot = incremental``) to that window, so they are committed to bronze with the
window (exactly once, like stream events). The next chunk starts right away, from inside
the hook, on a reader thread: its watermarks and SELECT overlap that window's bronze commit
and the next peek, and the next hook waits for it before observing its window.
Progress is durable per chunk (``incremental_state``); a killed run resumes at the first
chunk not committed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import psycopg2.extensions

from pgcdc_dagster.capture.faults import crash_point
from pgcdc_dagster.capture.incremental_state import ProgressStore, TableProgress
from pgcdc_dagster.capture.settings import DEFAULT_INCREMENTAL_CHUNK_SIZE, CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.capture.stream import StreamReport, run_windows
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.changes import Row, Window
from pgcdc_dagster.cdc.dblog import (
    ChunkWindow,
    Signal,
    Watermark,
    matching_tables,
    parse_signal,
)
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.plugins import DECODERBUFS
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.delta import committed_version, open_table
from pgcdc_dagster.names import table_id
from pgcdc_dagster.postgres.chunks import (
    ChunkSpec,
    emit_watermark,
    estimated_rows,
    max_key,
    order_columns,
    ordering,
    read_chunk,
)
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.discovery import current_database
from pgcdc_dagster.postgres.privileges import check_capture_privileges, explains_privileges
from pgcdc_dagster.postgres.signals import canonical_condition, validate_condition
from pgcdc_dagster.postgres.slot_lock import slot_guard

log = logging.getLogger(__name__)

WINDOWS_PER_ROUND = 4
DEFAULT_CHUNK_SIZE = DEFAULT_INCREMENTAL_CHUNK_SIZE
"""``incremental.snapshot.chunk.size`` default, chosen with ``bench/bench_incremental.py``
(docs/incremental.md, Settings: 65536 had the best median rows/s with and without concurrent
writes, against 1024 … 131072): Debezium's 1024 spends most of the time on the per-chunk
window round trips here."""


# --- signals ---------------------------------------------------------------------------------

@dataclass
class SignalOutcome:
    signal: Signal
    tables: list[str]
    note: str


@explains_privileges
def apply_signal(settings: CaptureSettings, signal: Signal, *,
                 chunk_size: int | None = None,
                 contexts: Sequence[TableContext] | None = None) -> SignalOutcome:
    """Record what a signal asks for in the progress store (runs then act on it).

    ``execute-snapshot`` starts (or restarts) the matching captured tables' snapshots;
    ``stop-snapshot`` stops the matching (or all) running ones; ``pause-snapshot`` and
    ``resume-snapshot`` pause and resume every running one.

    ``chunk_size`` defaults to ``settings.incremental_chunk_size``.

    Raises:
        ConfigurationError: a refused ``additional-conditions`` or ``surrogate-key``.

    Each filter is checked on its own (``postgres.signals.validate_condition``: parsed by
    PostgreSQL's parser against the filter grammar, then EXPLAINed READ ONLY); what is stored
    and later run is the canonical text of the filters ANDed, never the text as sent.
    """
    chunk_size = chunk_size or settings.incremental_chunk_size
    store = ProgressStore(settings.lakehouse, settings.slot)
    if signal.type == "log":
        log.info("signal %s: %s", signal.id, signal.message)
        return SignalOutcome(signal, [], f"logged: {signal.message}")
    if signal.type == "execute-snapshot":
        ctxs = list(contexts) if contexts is not None else load_contexts(settings)
        by_name = {c.relation.qualified: c for c in ctxs}
        tables = matching_tables(signal.data_collections, by_name)
        # Debezium warns about a data-collection it does not know and snapshots the others:
        # so do we, naming each entry that matches no captured table.
        unmatched = [p for p in signal.data_collections if not matching_tables([p], by_name)]
        missing = (f"no captured table matches {', '.join(map(repr, unmatched))}"
                   if unmatched else "")
        if missing:
            log.warning("signal %s: %s (left out)", signal.id, missing)
        if not tables:
            return SignalOutcome(signal, [], missing or "no data-collections")
        fresh = []
        with connection(settings.dsn) as conn:
            for name in tables:
                ctx = by_name[name]
                checked = [validate_condition(conn, name[0], name[1], raw,
                                              timeout_ms=settings.incremental_statement_timeout_ms)
                           for pattern, raw in signal.additional_conditions
                           if name in matching_tables([pattern], by_name)]  # each on its own
                cond = canonical_condition(conn, name[0], name[1], " AND ".join(checked)) \
                    if checked else None
                order_columns(conn, name[0], name[1], ctx.relation.key_names,
                              signal.surrogate_key)
                fresh.append(TableProgress(
                    snapshot_id=uuid.uuid4().hex, table=table_id(*name), name=list(name),
                    chunk_size=chunk_size, condition=cond, surrogate_key=signal.surrogate_key,
                    signal_id=signal.id, estimated_rows=estimated_rows(conn, *name)))
        for p in fresh:
            store.save(p)
        return SignalOutcome(signal, [p.table for p in fresh], "snapshot requested"
                             + (f"; {missing} (left out)" if missing else ""))
    changed = []
    for p in store.all():
        if signal.type == "stop-snapshot":
            if p.status in ("running", "paused") and (
                    not signal.data_collections
                    or matching_tables(signal.data_collections, [p.qualified])):
                p.status = "stopped"
        elif signal.type == "pause-snapshot" and p.status == "running":
            p.status = "paused"
        elif signal.type == "resume-snapshot" and p.status == "paused":
            p.status = "running"
        else:
            continue
        store.save(p)
        changed.append(table_id(*p.qualified))
    return SignalOutcome(signal, changed, f"{signal.type}: {len(changed)} table(s)")


def signal_from_config(signal_id: str, signal_type: str, data: dict[str, object] | str | None
                       ) -> Signal:
    """The Dagster channel: a signal given as run config."""
    return parse_signal(signal_id, signal_type, data)


# --- the run ----------------------------------------------------------------------------------

@dataclass
class TableReport:
    table: str
    status: str
    chunks_done: int
    chunks_total: int
    rows_read: int
    rows_emitted: int
    rows_dropped: int
    rows_early: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows_read / self.seconds if self.seconds > 0 else 0.0


@dataclass
class IncrementalReport:
    tables: list[TableReport] = field(default_factory=list)
    stream: list[StreamReport] = field(default_factory=list)
    seconds: float = 0.0
    read_seconds: float = 0.0
    """Time spent on chunk reads (low watermark, SELECT, high watermark, row buffering); the
    rest of ``seconds`` went to the slot windows (peek, decode, DBLog filter, bronze commit)."""

    @property
    def rows_emitted(self) -> int:
        return sum(t.rows_emitted for t in self.tables)


class _Driver:
    """Chunk pipeline driven from the window hook."""

    def __init__(self, settings: CaptureSettings, conn: psycopg2.extensions.connection,
                 contexts: dict[tuple[str, str], TableContext], queue: list[TableProgress],
                 store: ProgressStore, progress: Callable[[str], None]) -> None:
        self.settings = settings
        self.conn = conn
        self.contexts = contexts
        self.queue = queue
        self.store = store
        self.progress = progress
        self.current: tuple[TableProgress, ChunkWindow, ChunkSpec, dict[str, object]] | None \
            = None
        self.awaiting: tuple[TableProgress, Lsn] | None = None
        self.started = time.monotonic()
        self.read_seconds = 0.0
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pgcdc-chunk")
        self.reading: tuple[TableProgress, ChunkSpec, int, Future[tuple[
            int, list[Row], list[str | None] | None, float]]] | None = None

    def _spec(self, p: TableProgress) -> ChunkSpec:
        """What the next chunk reads. A stored filter is checked again (parsed, written out
        canonically) before it is run: the progress store is a file anyone with access to
        the lakehouse could edit, and a snapshot may have been requested by an older
        version."""
        ctx = self.contexts[p.qualified]
        order, nullable = ordering(self.conn, *p.qualified, ctx.relation.key_names,
                                   p.surrogate_key)
        condition = None
        if p.condition:
            try:
                condition = canonical_condition(self.conn, *p.qualified, p.condition)
            except ConfigurationError as exc:
                raise ConfigurationError(
                    f"incremental snapshot of {p.table}: its stored filter is refused ({exc}). "
                    "Send stop-snapshot for the table, then execute-snapshot with an allowed "
                    "filter.") from None
        return ChunkSpec(*p.qualified, tuple(c.name for c in ctx.relation.columns), order,
                         condition, nullable, self.settings.incremental_statement_timeout_ms)

    def confirm(self, upto: Lsn | None = None) -> None:
        """The window that carried the last closed chunk is committed."""
        if self.awaiting is None:
            return
        p, end = self.awaiting
        if upto is not None and int(upto) < int(end):
            return
        p.confirm_pending()
        self._save(p)
        self.awaiting = None
        crash_point("incremental_after_progress")

    def _status(self, p: TableProgress) -> str:
        on_disk = self.store.load(*p.qualified)
        if on_disk is None or on_disk.snapshot_id != p.snapshot_id:
            return "stopped"  # replaced by a newer execute-snapshot or removed
        p.status = on_disk.status if on_disk.status in ("paused", "stopped") else p.status
        return p.status

    def _save(self, p: TableProgress) -> None:
        """Save the run's progress without undoing a signal applied meanwhile: a pause or
        stop written while a chunk was in flight is kept (unless the snapshot just finished),
        and a snapshot replaced by a newer execute-snapshot is not overwritten."""
        on_disk = self.store.load(*p.qualified)
        if on_disk is not None and on_disk.snapshot_id != p.snapshot_id:
            return
        if on_disk is not None and p.status != "done" and on_disk.status in ("paused",
                                                                             "stopped"):
            p.status = on_disk.status
        self.store.save(p)

    def start_next(self) -> None:
        """Launch the next chunk's read (LW, SELECT, HW) in the background, or finish tables
        that are done. The read overlaps the bronze commit of the window that closed the
        previous chunk and the next peek; :meth:`settle` waits for it."""
        while self.current is None and self.reading is None and self.queue:
            p = self.queue[0]
            if self._status(p) != "running":
                self.queue.pop(0)
                continue
            spec = self._spec(p)
            if not p.planned:
                p.max_key = max_key(self.conn, spec)
                p.planned = True
                self._save(p)
            if p.max_key is None:
                p.status = "done"
                self._save(p)
                self.queue.pop(0)
                continue
            # The chunk before may still wait for its window's commit (p.pending).
            after = p.pending["last_key"] if p.pending else p.last_key
            chunk_no = p.chunks_done + (2 if p.pending else 1)
            self.reading = (p, spec, chunk_no,
                            self.pool.submit(self._read, p, spec, after, chunk_no))

    def _read(self, p: TableProgress, spec: ChunkSpec, after: list[str | None] | None,
              chunk_no: int) -> tuple[int, list[Row], list[str | None] | None, float]:
        """One chunk between its watermarks (runs on the reader thread; the main thread does
        not use ``self.conn`` meanwhile)."""
        t0 = time.monotonic()
        low = emit_watermark(self.conn, Watermark(p.snapshot_id, p.table, chunk_no, "low"))
        rows, last = read_chunk(self.settings.dsn, spec, after, p.max_key, p.chunk_size)
        crash_point("incremental_after_chunk_read")
        emit_watermark(self.conn, Watermark(p.snapshot_id, p.table, chunk_no, "high"))
        return low, rows, last, time.monotonic() - t0

    def settle(self) -> None:
        """Wait for the chunk being read and buffer it; a table whose read came back empty
        is finished and the next table's read waited for too."""
        while self.reading is not None:
            p, _spec, chunk_no, future = self.reading
            self.reading = None
            low, rows, last, seconds = future.result()
            self.read_seconds += seconds
            if not rows:
                if p.pending:  # done once the chunk before is committed
                    p.pending["final"] = True
                else:
                    p.status = "done"
                self._save(p)
                self.queue.pop(0)
                self.start_next()
                continue
            ctx = self.contexts[p.qualified]
            window = ChunkWindow.from_rows(p.snapshot_id, p.qualified, chunk_no, ctx.relation,
                                           ctx.relation.key_names, rows, low)
            meta: dict[str, object] = {"rows": len(rows), "last_key": last,
                                       "final": len(rows) < p.chunk_size, "read_s": seconds}
            self.current = (p, window, _spec, meta)

    def close(self) -> None:
        """Wait for a read still running (an error elsewhere), then stop the reader."""
        self.pool.shutdown(wait=True)

    def hook(self, window: Window, end: Lsn) -> None:
        self.confirm()
        self.settle()  # the chunk's rows must be buffered before this window is observed
        if self.current is None:
            return
        p, chunk, _spec, meta = self.current
        result = chunk.observe(window)
        if result.segments:
            window.tables.setdefault(p.qualified, []).extend(result.segments)
        if not result.closed:
            return
        high = chunk.high_watermark(window)
        assert high is not None
        emitted = result.emitted + chunk.early
        p.pending = {"chunk": chunk.chunk, "hw_commit_lsn": high.commit_lsn,
                     "last_key": meta["last_key"], "rows": meta["rows"], "emitted": emitted,
                     "dropped": chunk.dropped - chunk.early, "early": chunk.early,
                     "final": meta["final"]}
        p.seconds += time.monotonic() - self.started
        self.started = time.monotonic()
        self._save(p)
        self.awaiting = (p, end)
        self.current = None
        self.progress(f"incremental snapshot {p.table}: chunk {chunk.chunk} "
                      f"({meta['rows']} rows, {emitted} emitted, "
                      f"{chunk.dropped - chunk.early} superseded)")
        if meta["final"]:
            self.queue.pop(0)
        crash_point("incremental_after_high_watermark")
        self.start_next()


def _resume(p: TableProgress, ctx: TableContext) -> None:
    """Settle a pending chunk left by a run that stopped: committed, or to be read again."""
    if p.pending is None:
        return
    done = committed_version(open_table(ctx.bronze_uri), ctx.bronze_app_id)
    if done is not None and done > int(p.pending["hw_commit_lsn"]):
        p.confirm_pending()
    else:
        p.pending = None


@explains_privileges
def run_incremental(settings: CaptureSettings, *,
                    only: Collection[tuple[str, str]] | None = None,
                    progress: Callable[[str], None] = log.info,
                    max_rounds: int = 100_000) -> IncrementalReport:
    """Run the requested incremental snapshots (``only``: ``(schema, table)`` pairs) to the end,
    streaming every captured table meanwhile; return per-table progress.

    Holds the slot's lock throughout (progress, watermarks, chunk reads, windows): another
    reader gets SlotInUseError.

    Raises:
        ConfigurationError: ``plugin.name = decoderbufs``, which sends no logical decoding
            message, so the chunk watermarks would never be read back.
    """
    if settings.plugin_name == DECODERBUFS:
        raise ConfigurationError(
            "incremental snapshots need the watermark messages (pg_logical_emit_message) in "
            "the slot's stream, and plugin.name = decoderbufs does not send them; use "
            "pgoutput or wal2json (PGCDC_PLUGIN_NAME) for a slot that runs incremental "
            "snapshots, or re-snapshot with snapshot.mode = always")
    with connection(settings.dsn) as conn:  # up front: the slot needs REPLICATION
        check_capture_privileges(conn, settings.publication, (), "disabled")
    with slot_guard(settings.dsn, settings.slot):
        return _run_incremental(settings, only, progress, max_rounds)


def _run_incremental(settings: CaptureSettings, only: Collection[tuple[str, str]] | None,
                     progress: Callable[[str], None], max_rounds: int) -> IncrementalReport:
    started = time.monotonic()
    store = ProgressStore(settings.lakehouse, settings.slot)
    contexts = load_contexts(settings)
    by_name = {c.relation.qualified: c for c in contexts}
    queue = []
    for p in store.all():
        if only is not None and p.qualified not in only:
            continue
        if p.qualified not in by_name:
            if p.status == "running":
                raise ConfigurationError(f"incremental snapshot of {p.table}: the table is not "
                                         "captured (table.include.list)")
            continue
        _resume(p, by_name[p.qualified])
        store.save(p)
        if p.status == "running":
            queue.append(p)
    report = IncrementalReport()
    with connection(settings.dsn) as conn:
        ident = SourceIdentity(settings.topic_prefix, current_database(conn))
        driver = _Driver(settings, conn, by_name, queue, store, progress)
        try:
            driver.start_next()
            idle = 0
            for _ in range(max_rounds):
                driver.settle()  # its high watermark is written before the next peek
                if driver.current is None and driver.awaiting is None:
                    break
                # A few windows at a time: under constant writes run_windows would stream
                # on until its time budget after the last chunk.
                stream = run_windows(dataclasses.replace(settings,
                                                         max_windows=WINDOWS_PER_ROUND),
                                     contexts, ident, hook=driver.hook)
                report.stream.append(stream)
                if stream.end is not None:
                    driver.confirm(stream.end)
                idle = idle + 1 if not stream.windows else 0
                if idle > 3:
                    raise RuntimeError("incremental snapshot: the slot returned no window "
                                       "holding the high watermark")
        finally:
            driver.close()
    for p in store.all():
        if only is None or p.qualified in only:
            report.tables.append(TableReport(table_id(*p.qualified), p.status, p.chunks_done,
                                             p.chunks_total, p.rows_read, p.rows_emitted,
                                             p.rows_dropped, p.rows_early, p.seconds))
    report.seconds = time.monotonic() - started
    report.read_seconds = driver.read_seconds
    return report
