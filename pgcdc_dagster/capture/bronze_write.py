"""Writing decoded windows to bronze, exactly once per table (design.md §3, decision 3).

A :class:`BronzeWindowWriter` takes a window's segments (possibly in several portions, so
memory stays bounded), writes them as Parquet part files into each table's directory, and at
the end commits each table's parts in one Delta transaction that records the window end as
the table's app transaction. Transactions at or below a table's recorded window end are
dropped first: that is what makes a replay after a crash harmless.

Logical decoding messages (``op = m``) and transaction metadata (BEGIN/END records, when
``provide.transaction.metadata`` is on) go to two tables under ``<lakehouse>/bronze/_pgcdc``.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from pgcdc_dagster.capture.faults import crash_point
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.changes import Relation, TableChanges, Window
from pgcdc_dagster.cdc.envelope import SourceIdentity, bronze_from_changes
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.metadata_events import (
    MESSAGES_SCHEMA,
    TRANSACTIONS_SCHEMA,
    message_rows,
    transaction_rows,
)
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.exceptions import PgCdcError, SlotInUseError
from pgcdc_dagster.lake.delta import (
    DataFile,
    commit_files,
    committed_version,
    ensure_table,
    open_table,
    write_part,
)
from pgcdc_dagster.lake.evolution import evolve
from pgcdc_dagster.lake.paths import internal_uri

SKIPPABLE_OPS = frozenset("cudt")


def internal_events_key(name: str) -> str:
    """The key of a capture-wide table's counts among a window's events by table:
    ``bronze/_pgcdc/<name>``. Source tables count under ``schema.table``, which always holds
    a dot, so no source table (a schema ``_pgcdc`` included) shares these counts."""
    return f"bronze/_pgcdc/{name}"


def parse_skipped_operations(value: str) -> frozenset[str]:
    """``skipped.operations``: comma-separated c, u, d, t, or ``none``."""
    ops = {p.strip() for p in value.split(",") if p.strip()}
    if ops in ({"none"}, set()):
        return frozenset()
    unknown = ops - SKIPPABLE_OPS
    if unknown:
        from pgcdc_dagster.exceptions import ConfigurationError

        raise ConfigurationError(
            f"skipped.operations: {', '.join(sorted(unknown))} unknown; use c, u, d, t or none")
    return frozenset(ops)


def _select(seg: TableChanges, keep: Callable[[int], bool]) -> TableChanges:
    """The rows of ``seg`` for which ``keep(index)`` holds."""
    idx = [i for i in range(len(seg)) if keep(i)]
    if len(idx) == len(seg):
        return seg
    out = TableChanges(seg.relation, snapshot=seg.snapshot)
    for name in ("op", "commit_lsn", "lsn", "xid", "commit_ts_us", "total_order",
                 "collection_order", "before", "before_key_only", "after", "truncate_options"):
        src = getattr(seg, name)
        if src:
            setattr(out, name, [src[i] for i in idx])
    return out


def _fresh(seg: TableChanges, done: int | None, skipped: frozenset[str]) -> TableChanges:
    """Drop transactions already committed (commit LSN below ``done``) and skipped ops."""
    if done is not None and seg.commit_lsn and seg.commit_lsn[0] < done:
        # Commit LSNs ascend within a segment: cut the already-committed prefix.
        start = bisect.bisect_left(seg.commit_lsn, done)
        seg = _select(seg, lambda i: i >= start)
    if skipped and not skipped.isdisjoint(seg.op):
        ops = seg.op
        seg = _select(seg, lambda i: ops[i] not in skipped)
    return seg


@dataclass
class _Pending:
    ctx: TableContext
    done: int | None
    files: list[Future[DataFile]] = field(default_factory=list)
    schemas: list[pa.Schema] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)
    buffer: dict[pa.Schema, list[pa.Table]] = field(default_factory=dict)
    """Converted events not yet written (portions gathered into larger part files)."""
    buffered: int = 0
    ensured: bool = False
    """The bronze table exists (checked once per window: opening it replays its log)."""


def _named(exc: PgCdcError, table: str) -> PgCdcError:
    """``exc`` with the table's name in its message (converters know only the column)."""
    message = str(exc)
    if table in message:
        return exc
    try:
        return type(exc)(f"{table}: {message}")
    except TypeError:  # an error type with another constructor
        return PgCdcError(f"{table}: {message}")


@dataclass
class BronzeWindowWriter:
    """Accumulates one window's bronze part files per table, then commits them."""

    contexts: Mapping[tuple[str, str], TableContext]
    """Looked up only for the tables the windows carry events for (a lazy mapping, such as
    ``CapturedTables``, builds just those)."""
    converters: Callable[[Relation], Sequence[ColumnConverter]]
    ident: SourceIdentity
    lakehouse: str
    app_prefix: str
    skipped_ops: frozenset[str] = frozenset()
    tombstones_on_delete: bool = False
    transaction_metadata: bool = False
    ignore_message_prefixes: tuple[str, ...] = ()
    _pending: dict[tuple[str, str], _Pending] = field(default_factory=dict)
    _messages: list[pa.Table] = field(default_factory=list)
    _transactions: list[pa.Table] = field(default_factory=list)
    _meta_done: dict[str, int | None] = field(default_factory=dict)
    part_bytes: int = 8 << 20
    """Arrow bytes of a table's converted events gathered before they are written as one
    part file (fewer, larger files read faster into silver); at most twice this is
    held for all tables together, and at most two parts wait for the writer threads: the
    writer's memory is bounded by this, not by the window."""
    max_pending: int = 2
    """Windows or portions that may wait for the background worker (each holds its rows)."""
    _executor: ThreadPoolExecutor | None = None
    _writers: ThreadPoolExecutor | None = None
    _writing: deque[Future[DataFile]] = field(default_factory=deque)
    _inflight: deque[Future[None]] = field(default_factory=deque)

    def _meta_uri(self, name: str) -> str:
        return internal_uri(self.lakehouse, name)

    def _meta_app_id(self, name: str) -> str:
        return f"{self.app_prefix}:bronze:_pgcdc.{name}"

    def _meta_committed(self, name: str) -> int | None:
        if name not in self._meta_done:
            self._meta_done[name] = committed_version(open_table(self._meta_uri(name)),
                                                      self._meta_app_id(name))
        return self._meta_done[name]

    def _drain(self) -> None:
        """Wait for every queued window or portion (re-raising a failed one)."""
        while self._inflight:
            self._inflight.popleft().result()

    def close(self) -> None:
        """Stop the background worker. Errors were raised by :meth:`commit` already; after
        a failed read nothing of the window is committed, so they are dropped here."""
        try:
            self._drain()
        except Exception:  # the caller is already failing, or committed (and raised)
            self._inflight.clear()
        finally:
            for pool in (self._executor, self._writers):
                if pool is not None:
                    pool.shutdown(wait=True)
            self._executor = self._writers = None
            self._writing.clear()

    def _state(self, key: tuple[str, str]) -> _Pending | None:
        pending = self._pending.get(key)
        if pending is None:
            ctx = self.contexts.get(key)
            if ctx is None:
                return None  # published but not captured (e.g. a FOR ALL TABLES publication)
            done = committed_version(open_table(ctx.bronze_uri), ctx.bronze_app_id)
            pending = self._pending[key] = _Pending(ctx, done)
        return pending

    def add(self, window: Window) -> None:
        """Convert and write the window's (portion's) events as uncommitted part files.

        The work is queued to one background thread, in order, so the caller goes on
        decoding the window meanwhile (Arrow's kernels and Parquet writer release the GIL);
        at most ``max_pending`` windows or portions wait, which bounds their memory.
        :meth:`commit` waits for all of them and re-raises a failure.
        """
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="pgcdc-bronze")
        while len(self._inflight) >= self.max_pending:
            self._inflight.popleft().result()
        self._inflight.append(self._executor.submit(self._add, window))

    def _add(self, window: Window) -> None:
        """Convert and write one window or portion (on the background thread).

        Each segment is shaped by its table's context first (``TableContext.shape``: the
        table's key, the captured columns, the column options), so streamed events are
        encoded exactly as the snapshot's.
        """
        now_ms = int(time.time() * 1000)
        for key, segments in window.tables.items():
            pending = self._state(key)
            if pending is None:
                continue
            done = pending.done
            tables = []
            for seg in segments:
                seg = _fresh(seg, done, self.skipped_ops)
                if not len(seg):
                    continue
                try:
                    seg, converters = pending.ctx.shape(seg, self.converters)
                    tables.append(bronze_from_changes(
                        seg, converters, self.ident, now_ms,
                        tombstones=self.tombstones_on_delete))
                except PgCdcError as exc:
                    raise _named(exc, pending.ctx.name) from exc
            if not tables:
                continue
            groups: dict[pa.Schema, list[pa.Table]] = {}
            for table in tables:
                groups.setdefault(table.schema, []).append(table)
            if not pending.ensured:
                ensure_table(pending.ctx.bronze_uri, tables[0].schema)
                pending.ensured = True
            for schema, same in groups.items():
                pending.buffer.setdefault(schema, []).extend(same)
                for data in same:
                    pending.buffered += data.nbytes
                    counts = pc.value_counts(data.column("op").combine_chunks()).to_pylist()
                    for item in counts:
                        op = str(item["values"])
                        pending.ops[op] = pending.ops.get(op, 0) + int(item["counts"])
            if pending.buffered >= self.part_bytes:
                self._flush(pending)
        if sum(p.buffered for p in self._pending.values()) > 2 * self.part_bytes:
            for pending in self._pending.values():
                self._flush(pending)
        done_msgs = self._meta_committed("messages") if window.messages else None
        msgs = [m for m in window.messages
                if not m.prefix.startswith(self.ignore_message_prefixes)
                and (done_msgs is None or m.commit_lsn >= done_msgs)]
        if msgs:
            self._messages.append(message_rows(msgs, self.ident, now_ms))
        if self.transaction_metadata and window.transactions:
            done_tx = self._meta_committed("transactions")
            txs = [t for t in window.transactions if done_tx is None or t.commit_lsn >= done_tx]
            if txs:
                self._transactions.append(transaction_rows(txs, self.ident, now_ms))

    def _flush(self, pending: _Pending) -> None:
        """Write the table's buffered events as part files (one per schema), on the writer
        threads: Parquet encoding releases the GIL, so it overlaps conversion and decoding."""
        if self._writers is None:
            self._writers = ThreadPoolExecutor(2, thread_name_prefix="pgcdc-bronze-write")
        for schema, tables in pending.buffer.items():
            while len(self._writing) >= 2:  # bounds the tables waiting to be written
                self._writing.popleft().result()
            data = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
            future = self._writers.submit(write_part, pending.ctx.bronze_uri, data, "part-stream")
            self._writing.append(future)
            pending.files.append(future)
            pending.schemas.append(schema)
        pending.buffer.clear()
        pending.buffered = 0

    def commit(self, upto: Lsn, start: Lsn | None = None) -> dict[str, dict[str, int]]:
        """Commit every table's parts with app transaction ``upto``; return events by op.

        ``start`` (the slot's confirmed position when the window was read) is recorded with
        ``upto`` in the commit metadata, so a check can prove windows chain without gaps.
        """
        self._drain()
        for pending in self._pending.values():
            self._flush(pending)
        counts: dict[str, dict[str, int]] = {}
        meta = {"pgcdc.kind": "stream", "pgcdc.window_end": str(upto)}
        if start is not None:
            meta["pgcdc.window_start"] = str(start)
        for pending in self._pending.values():
            if not pending.files:
                continue
            table = ensure_table(pending.ctx.bronze_uri, pending.ctx.bronze_schema)
            schema = pa.schema(table.schema().to_arrow())
            for incoming in pending.schemas:
                schema = evolve(table, incoming, f"bronze of {pending.ctx.name}")
            _commit_once(table, [f.result() for f in pending.files], schema,
                         pending.ctx.bronze_app_id, pending.done, upto, meta,
                         f"bronze of {pending.ctx.name}")
            crash_point("between_table_commits")
            counts[pending.ctx.name] = dict(pending.ops)
        for name, schema, parts in (("messages", MESSAGES_SCHEMA, self._messages),
                                    ("transactions", TRANSACTIONS_SCHEMA, self._transactions)):
            if not parts:
                continue
            uri, app_id = self._meta_uri(name), self._meta_app_id(name)
            table = ensure_table(uri, schema)
            data = pa.concat_tables(parts)
            _commit_once(table, [write_part(uri, data, "part-stream")], schema, app_id,
                         self._meta_done.get(name), upto, meta, f"bronze/_pgcdc/{name}")
            counts[internal_events_key(name)] = {"m" if name == "messages" else "tx": data.num_rows}
        self._pending.clear()
        self._writing.clear()
        self._messages.clear()
        self._transactions.clear()
        self._meta_done.clear()
        return counts


def _commit_once(table: DeltaTable, files: Sequence[DataFile], schema: pa.Schema, app_id: str,
                 expected: int | None, upto: Lsn, meta: dict[str, str], what: str) -> None:
    """Append a window's files unless another writer committed to ``app_id`` since the
    window was read (its events were filtered against ``expected``, the app transaction's
    version then): that writer read the same slot, and appending would duplicate events.

    The check is atomic with the commit: ``table`` is the snapshot the check read, and
    delta-rs refuses the commit ("Concurrent transaction") when a commit made after that
    snapshot carries the same app id.

    Raises:
        SlotInUseError: another writer committed this table's window first; nothing of this
            window was committed for this table.
    """
    found = committed_version(table, app_id)
    if found == expected:
        try:
            commit_files(table, files, schema, mode="append", app_id=app_id,
                         version=int(upto), metadata=meta)
            return
        except CommitFailedError:
            found = committed_version(open_table(table.table_uri), app_id)
            if found == expected:
                raise
    theirs = "nothing" if found is None else f"up to {Lsn(found)}"
    mine = "nothing" if expected is None else f"up to {Lsn(expected)}"
    raise SlotInUseError(
        f"{what}: another writer committed {theirs} while this run read its window (bronze "
        f"held {mine} then); appending the window up to {upto} would duplicate its events, "
        "so it was not committed. Two readers used the same replication slot at once: give "
        "each capture its own slot, and let one run at a time read it (the slot lock does).")


def write_window(window: Window, upto: Lsn, contexts: dict[tuple[str, str], TableContext],
                 converters: Callable[[Relation], Sequence[ColumnConverter]],
                 ident: SourceIdentity, lakehouse: str = "", app_prefix: str = "pgcdc"
                 ) -> dict[str, dict[str, int]]:
    """Write and commit one whole window (see :class:`BronzeWindowWriter`)."""
    writer = BronzeWindowWriter(contexts, converters, ident, lakehouse, app_prefix)
    try:
        writer.add(window)
        return writer.commit(upto)
    finally:
        writer.close()
