"""Micro-batches: bounded slot windows into bronze exactly once, then the slot advance.

Each window (design.md §3, decisions 2–3; STR- items):
1. ``upto`` = min(WAL flushed when the run started, confirmed position +
   ``window_max_bytes``): never unbounded;
2. peek the slot up to ``upto`` (whole transactions only; nothing is consumed);
3. per table, drop transactions at or below the table's committed window (a replay after a
   crash between the bronze commit and the slot advance) and append the rest to bronze,
   recording ``upto`` as the table's Delta app transaction;
4. only then advance the slot to ``upto`` (after the bronze commit, not after silver).
Silver catches up from bronze after the windows: it is derived from bronze, so a crash
before it loses nothing (the next run's catch-up applies what bronze holds).

A window's events reach the bronze writer in portions of ``window_portion_changes`` while
the COPY still streams (``peek_window(..., on_portion=...)``), so a transaction of millions
of rows is converted and written as bounded part files; they are committed only once the
whole window was read (a failed read leaves uncommitted orphans, never partial windows).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import psycopg2
import psycopg2.extensions
import pyarrow as pa

from pgcdc_dagster.capture.bronze_write import BronzeWindowWriter, parse_skipped_operations
from pgcdc_dagster.capture.captured import CapturedTables
from pgcdc_dagster.capture.faults import crash_point
from pgcdc_dagster.capture.read_faults import (
    connection_lost,
    lost_while_reading,
    publication_missing,
)
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot_modes import missed_windows
from pgcdc_dagster.capture.tables import TableContext, converters_for
from pgcdc_dagster.cdc.changes import Relation, Window
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.plugins import PGOUTPUT_WIRE
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.delta import append_arrow, open_table
from pgcdc_dagster.lake.memory import release_unused
from pgcdc_dagster.lake.paths import slot_root
from pgcdc_dagster.postgres.catalog import load_types
from pgcdc_dagster.postgres.connection import connect, connection
from pgcdc_dagster.postgres.peek import peek_window
from pgcdc_dagster.postgres.slot import (
    advance_slot,
    current_flush_lsn,
    ensure_publication,
    require_usable_slot,
)
from pgcdc_dagster.postgres.slot_lock import slot_guard

log = logging.getLogger(__name__)


@dataclass
class WindowReport:
    """What one window did."""

    start: Lsn
    end: Lsn
    changes: int
    transactions: int
    events_by_table: dict[str, dict[str, int]]
    seconds: float


@dataclass
class StreamReport:
    """Outcome of one micro-batch run."""

    start: Lsn | None = None
    end: Lsn | None = None
    windows: list[WindowReport] = field(default_factory=list)
    slot_lag_bytes: int = 0
    slot_retained_bytes: int = 0
    wal_status: str | None = None
    seconds: float = 0.0

    def events_by_table(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for w in self.windows:
            for table, ops in w.events_by_table.items():
                dest = out.setdefault(table, {})
                for op, n in ops.items():
                    dest[op] = dest.get(op, 0) + n
        return out


class _ConverterCache:
    """Converters per relation shape (a Relation message may change the shape mid-stream).

    Types are looked up on a connection of its own, opened at the first miss: portions reach
    the bronze writer while the window's COPY still occupies the peek connection.
    """

    def __init__(self, dsn: str, settings: CaptureSettings) -> None:
        self._dsn = dsn
        self._conn: psycopg2.extensions.connection | None = None
        self._settings = settings
        self._cache: dict[Relation, list[ColumnConverter]] = {}

    def get(self, relation: Relation) -> list[ColumnConverter]:
        convs = self._cache.get(relation)
        if convs is None:
            if self._conn is None:
                self._conn = connect(self._dsn)
            types = load_types(self._conn, {c.type_oid for c in relation.columns})
            convs = converters_for(relation.columns, types, self._settings.modes)  # type: ignore[arg-type]
            self._cache[relation] = convs
        return convs

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


HEARTBEAT_PREFIX = "pgcdc.heartbeat"
OWN_MESSAGE_PREFIXES = ("pgcdc.",)
"""Logical messages this project writes itself (heartbeats, watermarks): not user events."""


def heartbeat(conn: psycopg2.extensions.connection, settings: CaptureSettings) -> None:
    """Run ``heartbeat.action.query`` and emit a heartbeat message when configured."""
    with conn.cursor() as cur:
        if settings.heartbeat_action_query:
            cur.execute(settings.heartbeat_action_query)
        if settings.heartbeat_interval_ms > 0:
            cur.execute("SELECT pg_logical_emit_message(false, %s, now()::text)",
                        (HEARTBEAT_PREFIX,))


def window_end(window: Window, upto: Lsn, cap: int | None) -> Lsn:
    """The position a window covers exactly, for the bronze commit and the slot advance.

    Without truncation the window holds exactly the transactions whose commit record starts
    before ``upto``, which are the ones a slot confirmed at ``upto`` skips. With
    ``upto_nchanges`` PostgreSQL stops after the record whose output reached the cap (it counts
    every row: BEGIN, COMMIT, RELATION, messages); that record is a commit or a
    non-transactional message, so the window then ends just after the later of the two.
    """
    if cap is None or not _maybe_truncated(window, cap):
        return upto
    ends = [int(window.last_commit_end_lsn)] if window.transactions else []
    ends += [int(m.lsn) + 1 for m in window.messages if not m.transactional]
    if not ends:
        return upto
    return Lsn(min(int(upto), max(ends)))


def _maybe_truncated(window: Window, cap: int) -> bool:
    """An upper bound of the rows the peek returned reached the cap."""
    if window.slot_rows:  # exact, and still right when segments went out in portions
        return window.slot_rows >= cap
    rows = (window.change_count + 2 * len(window.transactions)
            + 2 * len(window.segments()) + 16)
    return rows >= cap


CAPTURE_SET_SCHEMA = pa.schema([
    pa.field("position", pa.int64(), nullable=False),
    pa.field("tables", pa.list_(pa.struct([pa.field("schema", pa.string()),
                                           pa.field("table", pa.string()),
                                           pa.field("oid", pa.int64())]))),
    pa.field("recorded_ms", pa.int64()),
])
"""``oid``: the table's relation OID when the set was recorded (null in logs written before
it was kept): a table dropped and created again under its name has another one."""


def capture_set_uri(lakehouse: str, slot: str) -> str:
    """Where the capture-set log of a capture (slot) lives."""
    return f"{slot_root(lakehouse, slot)}/capture_set"


CaptureSetLog = list[tuple[int, frozenset[tuple[str, str]], dict[tuple[str, str], int]]]
"""``(slot position, tables, their relation OIDs where recorded)``, oldest first."""


def capture_set_log(settings: CaptureSettings) -> CaptureSetLog:
    """The capture sets windows were read with, oldest first."""
    table = open_table(capture_set_uri(settings.lakehouse, settings.slot))
    if table is None:
        return []
    rows = sorted(table.to_pyarrow_table().to_pylist(),
                  key=lambda r: (r["position"], r["recorded_ms"]))
    return [(int(r["position"]), frozenset((t["schema"], t["table"]) for t in r["tables"]),
             {(t["schema"], t["table"]): int(t["oid"]) for t in r["tables"]
              if t.get("oid") is not None})
            for r in rows]


def recreated_tables(log: CaptureSetLog, relations: Sequence[Relation]
                     ) -> dict[tuple[str, str], int]:
    """The captured tables dropped and created again under their name since the capture set
    was last recorded (their relation OID changed), with the OID recorded for them.

    Nothing tells a dropped table's events apart in bronze or silver (pgoutput sends no
    DROP), and the new table's rows written before it joined the publication are in no
    window: its silver must be snapshotted again (:func:`record_capture_set` keeps the old
    OID until then)."""
    if not log:
        return {}
    before = log[-1][2]
    return {r.qualified: before[r.qualified] for r in relations
            if before.get(r.qualified, r.oid) != r.oid}


def last_capture_set(settings: CaptureSettings) -> frozenset[tuple[str, str]]:
    """The tables the last windows were read for (empty when none were read)."""
    log = capture_set_log(settings)
    return log[-1][1] if log else frozenset()


def record_capture_set(settings: CaptureSettings, position: Lsn,
                       tables: Sequence[tuple[str, str]],
                       log: CaptureSetLog | None = None,
                       oids: Mapping[tuple[str, str], int] | None = None) -> None:
    """Log the tables the windows from ``position`` on are read for (with their relation
    ``oids``), when that set changed.

    A table removed from the capture set keeps its bronze offset, but the windows read
    while it was out dropped its changes; this log is how the next run knows (see
    :func:`stale_tables`, :func:`recreated_tables`). ``log``: the log already read by the
    caller."""
    log = capture_set_log(settings) if log is None else log
    current = frozenset(tables)
    known = {k: v for k, v in (oids or {}).items() if k in current}
    if log and log[-1][1] == current and log[-1][2] == known:
        return
    data = pa.table({
        "position": [int(position)],
        "tables": [[{"schema": s, "table": t, "oid": known.get((s, t))}
                    for s, t in sorted(current)]],
        "recorded_ms": [max(int(time.time() * 1000), _last_ms(settings) + 1)],
    }, schema=CAPTURE_SET_SCHEMA)
    append_arrow(capture_set_uri(settings.lakehouse, settings.slot), data,
                 app_id=f"{settings.app_prefix}:capture_set", version=int(position))


def _last_ms(settings: CaptureSettings) -> int:
    table = open_table(capture_set_uri(settings.lakehouse, settings.slot))
    if table is None:
        return 0
    values = table.to_pyarrow_table().column("recorded_ms").to_pylist()
    return max((v for v in values if v is not None), default=0)


def stale_tables(settings: CaptureSettings,
                 contexts: Sequence[TableContext] | CapturedTables,
                 confirmed: Lsn, log: CaptureSetLog | None = None,
                 offsets: Mapping[tuple[str, str], int | None] | None = None
                 ) -> list[TableContext]:
    """Tables whose bronze offset was passed by windows read without them (a table removed
    from the capture set and added back): streaming them on would lose those changes.
    ``log``: the log already read by the caller; ``offsets``: bronze offsets by
    ``(schema, table)`` the caller knows to be current (the others are read from bronze,
    only for tables some window was read without)."""
    log = capture_set_log(settings) if log is None else log
    if not log:
        return []
    tables = CapturedTables.of(contexts, settings)
    known = offsets if offsets is not None else {}
    last = log[-1][1]
    out = []
    for name in tables.names:
        # Not opened: a table in the last set passed this check when it entered
        # the sets it has been in since (they are recorded after the check), and its offset
        # only grows; a table in every set since the slot's start missed nothing from any
        # offset.
        if name in last or not missed_windows(log, name, 0, int(confirmed)):
            continue
        offset = known[name] if name in known else tables.offset(name)
        if offset is not None and missed_windows(log, name, offset, int(confirmed)):
            out.append(tables[name])
    return out


WindowHook = Callable[[Window, Lsn], None]
"""Called with each decoded window and its end before the window is written; it may add
segments to the window (incremental-snapshot chunks) and write new WAL (watermarks)."""


def run_windows(settings: CaptureSettings, contexts: Sequence[TableContext] | CapturedTables,
                ident: SourceIdentity, *, hook: WindowHook | None = None,
                offsets: Mapping[tuple[str, str], int | None] | None = None
                ) -> StreamReport:
    """Read and write windows until caught up, out of windows, or out of time.

    ``offsets``: bronze offsets by ``(schema, table)`` known to be current (:func:`stale_tables`).
    A table dropped and created again keeps its old OID in the capture-set log until
    :func:`~pgcdc_dagster.capture.runner.run_bronze` has snapshotted it again.
    Of :class:`CapturedTables`, only the tables the windows carry events for are built
    (their bronze opened): an idle table is not touched.
    """
    started = time.monotonic()
    report = StreamReport()
    by_name = CapturedTables.of(contexts, settings)
    skipped = parse_skipped_operations(settings.skipped_operations)
    # One reader per slot: the slot's lock is held for the whole loop (the caller's, when it
    # holds it already) and checked again before each window is made durable.
    with slot_guard(settings.dsn, settings.slot) as lease, connection(settings.dsn) as conn:
        info = require_usable_slot(conn, settings.slot, settings.plugin_name)
        assert info.confirmed_flush_lsn is not None
        if settings.publication_autocreate == "filtered":
            ensure_publication(conn, settings.publication, by_name.relations)
        position = info.confirmed_flush_lsn
        log = capture_set_log(settings)  # read once per run
        stale = stale_tables(settings, by_name, position, log, offsets)
        if stale:
            raise ConfigurationError(
                f"{', '.join(c.name for c in stale)}: windows were read while the table was "
                "out of the capture set, so its changes of that time are not in bronze and "
                "its offset cannot be reused. Run the micro-batch (bronze) job first: it "
                "snapshots the table again and replaces its silver.")
        oids = {r.qualified: r.oid for r in by_name.relations}
        oids.update(recreated_tables(log, by_name.relations))
        record_capture_set(settings, position, by_name.names, log, oids)
        heartbeat(conn, settings)
        report.start = position
        cache = _ConverterCache(settings.dsn, settings)
        writer = BronzeWindowWriter(
            by_name, cache.get, ident, settings.lakehouse, settings.app_prefix,
            skipped_ops=skipped, tombstones_on_delete=settings.tombstones_on_delete,
            transaction_metadata=settings.provide_transaction_metadata,
            ignore_message_prefixes=OWN_MESSAGE_PREFIXES)
        # Without a hook, the run catches up to the WAL flushed when it started: WAL written
        # meanwhile (autovacuum, new changes) is the next run's, so a run ends instead of
        # peeking once more (every peek decodes again from the slot's restart point). A hook
        # (incremental snapshot) writes watermarks it must read back: it follows the WAL.
        target = current_flush_lsn(conn) if hook is None else None
        try:
            for _ in range(settings.max_windows):
                if time.monotonic() - started > settings.time_budget_s:
                    break
                flushed = current_flush_lsn(conn) if target is None else target
                if flushed <= position:
                    break
                upto = Lsn(min(int(flushed), int(position) + settings.window_max_bytes))
                w_started = time.monotonic()
                cap = settings.window_max_changes or None
                # Portions: a huge transaction reaches bronze in bounded pieces while the
                # COPY still streams. Not with a hook: it must see the whole window.
                portion = settings.window_portion_changes if hook is None else 0
                if settings.plugin_name in PGOUTPUT_WIRE:  # pgoutput, yboutput
                    window = peek_window(conn, settings.slot, settings.publication, upto,
                                         upto_nchanges=cap, portion_changes=portion or None,
                                         on_portion=writer.add if portion else None)
                else:  # decoderbufs / wal2json rows translated to pgoutput (cdc/plugins)
                    # imported here: protobuf and the translators only for those plugins
                    from pgcdc_dagster.postgres.plugin_peek import peek_plugin_window
                    window = peek_plugin_window(
                        conn, settings.plugin_name, settings.slot, settings.publication, upto,
                        upto_nchanges=cap, portion_changes=portion or None,
                        on_portion=writer.add if portion else None)
                crash_point("after_decode")
                end = window_end(window, upto, cap)
                if hook is not None:
                    hook(window, end)
                writer.add(window)
                lease.verify()
                counts = writer.commit(end, position)
                crash_point("after_bronze_commit")
                # Only after every bronze commit may the slot forget the window.
                advance_slot(conn, settings.slot, end)
                crash_point("after_advance")
                release_unused()
                report.windows.append(WindowReport(position, end, window.change_count,
                                                   len(window.transactions), counts,
                                                   time.monotonic() - w_started))
                position = end
        except psycopg2.Error as exc:
            missing = publication_missing(exc, settings.slot, settings.publication, position)
            if missing is not None:
                raise missing from exc
            if not connection_lost(exc, conn):
                raise
            raise lost_while_reading(exc, settings.dsn, settings.slot, position) from exc
        finally:
            writer.close()
            cache.close()
        report.end = position
        final = require_usable_slot(conn, settings.slot, settings.plugin_name)
        report.slot_lag_bytes = final.lag_bytes
        report.slot_retained_bytes = final.retained_bytes
        report.wal_status = final.wal_status
    report.seconds = time.monotonic() - started
    return report
