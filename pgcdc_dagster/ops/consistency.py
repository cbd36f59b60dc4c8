"""Silver against the source: row count, key checksum and row checksum at a known LSN.

Silver reflects the source as of the slot's confirmed position ``C`` (every window up to
``C`` is in bronze, and silver applied all of bronze). The source is read in a REPEATABLE
READ snapshot taken at WAL position ``L >= C``. Keys that changed between ``C`` and ``L`` are
found by peeking the slot up to ``L`` (nothing is consumed) and left out of both sides, so
the comparison is exact for every other key whatever the write load. Both sides are brought
to silver's native types by the capture's own converters and cast to one Arrow schema
(silver's types of the columns both sides have), then hashed column by column
(:mod:`pgcdc_dagster.cdc.row_hash`, :mod:`pgcdc_dagster.ops.digest`):

* ``rows``: live rows (silver ``WHERE NOT __deleted``);
* ``key checksum``: sum of 64-bit hashes of the primary-key tuples;
* ``row checksum``: sum of 64-bit hashes of whole rows (every column both sides have).

When the sides differ and a side holds at most ``keep_limit`` rows, up to five keys of each
kind of difference are named (missing in silver, not in the source, values differ).

The comparison is skipped (``compared`` False, with the reason) when it cannot be exact:
silver behind bronze, the slot missing or in use, a TRUNCATE pending, or a backlog larger
than ``max_pending_bytes`` (run the micro-batch first).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from urllib.parse import unquote

import numpy as np
import numpy.typing as npt
import psycopg2.errors
import psycopg2.extensions
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.exceptions import DeltaError
from psycopg2 import sql

from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.changes import TableChanges
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.exceptions import PgCdcError, SlotInUseError
from pgcdc_dagster.lake.bronze_read import conform_table
from pgcdc_dagster.lake.delta import load_table
from pgcdc_dagster.lake.storage import filesystem
from pgcdc_dagster.ops.digest import Digest, differences, key_hashes
from pgcdc_dagster.ops.table_facts import TableFacts, read_facts, still_at
from pgcdc_dagster.postgres.arrow_reader import ArrowSnapshot, text_select
from pgcdc_dagster.postgres.connection import connection, redact
from pgcdc_dagster.postgres.peek import peek_window
from pgcdc_dagster.postgres.privileges import explain_error
from pgcdc_dagster.postgres.slot import slot_info
from pgcdc_dagster.postgres.slot_lock import slot_guard_or_reason

SILVER_BATCH_ROWS = 65_536
"""Silver rows hashed at a time (memory stays bounded whatever the table's size)."""
DELETED = "__deleted"

__all__ = ["COMPARE_ERRORS", "ConsistencyReport", "Digest", "compare_tables",
           "compare_with_source"]

@dataclass
class ConsistencyReport:
    """Outcome of comparing one table's silver with its source."""

    table: str
    compared: bool = False
    reason: str = ""
    silver_lsn: Lsn | None = None
    """The slot's confirmed position: silver holds every change up to it."""
    source_lsn: Lsn | None = None
    """WAL position of the source snapshot compared."""
    silver_version: int | None = None
    bronze_version: int | None = None
    pending_events: int = 0
    """Events of this table between ``silver_lsn`` and ``source_lsn``."""
    excluded_keys: int = 0
    columns: list[str] = field(default_factory=list)
    skipped_columns: list[str] = field(default_factory=list)
    source: Digest = field(default_factory=Digest)
    silver: Digest = field(default_factory=Digest)
    missing: list[str] = field(default_factory=list)
    """Sample of keys in the source but not in silver."""
    extra: list[str] = field(default_factory=list)
    """Sample of keys in silver but not in the source."""
    different: list[str] = field(default_factory=list)
    """Sample of keys whose row differs."""

    @property
    def rows_match(self) -> bool:
        return self.source.rows == self.silver.rows

    @property
    def keys_match(self) -> bool:
        return self.source.key_checksum == self.silver.key_checksum

    @property
    def values_match(self) -> bool:
        return self.source.row_checksum == self.silver.row_checksum

    @property
    def ok(self) -> bool:
        return self.compared and self.rows_match and self.keys_match and self.values_match

    def describe(self) -> str:
        if not self.compared:
            return f"{self.table}: not compared: {self.reason}"
        where = (f"source at {self.source_lsn}, silver at {self.silver_lsn}"
                 + (f", {self.excluded_keys} keys changed in between left out"
                    if self.excluded_keys else ""))
        if self.ok:
            return f"{self.table}: silver matches the source ({self.source.rows} rows; {where})"
        parts = []
        if not self.rows_match:
            parts.append(f"rows: source {self.source.rows}, silver {self.silver.rows}")
        if not self.keys_match:
            parts.append("key checksums differ")
        if not self.values_match:
            parts.append("row checksums differ")
        for label, sample in (("missing in silver", self.missing),
                              ("not in the source", self.extra),
                              ("values differ", self.different)):
            if sample:
                parts.append(f"{label}: {', '.join(sample)}")
        return f"{self.table}: silver differs from the source ({'; '.join(parts)}; {where})"


def _key_images(seg: TableChanges, keys: Sequence[str]) -> Iterator[tuple[object, ...]]:
    """Key values (text bytes or None) of every row image of the segment."""
    names = [c.name for c in seg.relation.columns]
    if any(k not in names for k in keys):
        return
    pos = [names.index(k) for k in keys]
    for before, after in zip(seg.before, seg.after, strict=True):
        for image in (before, after):
            if image is not None:
                yield tuple(image[p] for p in pos)


def _convert(convs: Sequence[ColumnConverter], targets: Sequence[pa.DataType],
             texts: Sequence[Sequence[str | None]]) -> list[pa.Array]:
    return [conv.to_silver(pa.array(list(col), pa.string())).cast(typ)
            for conv, typ, col in zip(convs, targets, texts, strict=True)]


def _wait_flushed(conn: psycopg2.extensions.connection, lsn: Lsn, timeout_s: float) -> bool:
    """Make WAL up to ``lsn`` durable, so that logical decoding can read it.

    With ``synchronous_commit = off`` a commit is visible before its WAL is flushed, and WAL
    in a partly filled page may wait for the next flush indefinitely. A synchronous commit
    of a transaction with an xid (and no row change: nothing is decoded) flushes everything
    before its commit record.
    """
    deadline = time.monotonic() + timeout_s
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("SET LOCAL synchronous_commit = on")
        cur.execute("SELECT txid_current()")
        cur.execute("COMMIT")
        while True:
            cur.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (str(lsn),))
            if cur.fetchone()[0]:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)


class _Comparison:
    def __init__(self, ctx: TableContext, report: ConsistencyReport, target: pa.Schema,
                 convs: Sequence[ColumnConverter], keep_limit: int,
                 facts: TableFacts) -> None:
        self.ctx = ctx
        self.report = report
        self.target = target
        self.convs = convs
        self.names = target.names
        self.key_pos = [self.names.index(k) for k in ctx.relation.key_names]
        self.keep_limit = keep_limit
        self.facts = facts
        self.touched: npt.NDArray[np.uint64] = np.empty(0, np.uint64)
        """Sorted hashes of the keys changed after silver's position."""

    def exclude(self, images: Sequence[tuple[object, ...]]) -> None:
        if not images:
            return
        key_convs = [self.convs[i] for i in self.key_pos]
        key_types = [self.target.field(i).type for i in self.key_pos]
        texts: list[list[str | None]] = [[] for _ in self.key_pos]
        for image in images:
            if not all(v is None or isinstance(v, bytes) for v in image):
                continue  # an unchanged TOAST key value: the other image names the key
            for col, value in zip(texts, image, strict=True):
                col.append(value.decode() if isinstance(value, bytes) else None)
        self.touched = np.unique(key_hashes(_convert(key_convs, key_types, texts)))
        self.report.excluded_keys = len(self.touched)

    def digest(self, side: Digest, batch: pa.RecordBatch | pa.Table) -> None:
        side.add(batch, self.key_pos, self.touched, self.keep_limit)

    def source_batch(self, text: pa.RecordBatch) -> pa.Table:
        arrays = [conv.to_silver(text.column(i)).cast(self.target.field(i).type)
                  for i, conv in enumerate(self.convs)]
        return pa.Table.from_arrays(arrays, schema=self.target)

    def silver_batches(self) -> Iterator[pa.Table]:
        """Silver's live rows at the pinned version, from the data files the sweep's read
        of the log listed (no second open of the table), else through delta-rs."""
        report, facts = self.report, self.facts
        if facts.silver_files is None or facts.silver_schema is None:
            dataset = load_table(self.ctx.silver_uri, report.silver_version).to_pyarrow_dataset()
            for batch in dataset.to_batches(columns=report.columns,
                                            filter=~pc.field("__deleted")):
                yield pa.Table.from_batches([batch.cast(self.target)])
            return
        wanted = pa.schema([facts.silver_schema.field(c) for c in (*report.columns, DELETED)])
        fs, base = filesystem(self.ctx.silver_uri)
        for path in facts.silver_files:
            with fs.open_input_file(f"{base.rstrip('/')}/{unquote(path)}") as handle:
                parquet = pq.ParquetFile(handle)
                stored = parquet.schema_arrow.names
                for batch in parquet.iter_batches(
                        batch_size=SILVER_BATCH_ROWS, use_threads=False,
                        columns=[c for c in wanted.names if c in stored]):
                    # columns added after the file was written are null, types as silver's
                    data = conform_table(pa.Table.from_batches([batch]), wanted)
                    live = data.filter(pc.invert(data[DELETED])).drop_columns([DELETED])
                    yield live.cast(self.target)


def _samples(report: ConsistencyReport) -> None:
    """Name differing keys (when the sides differ and were small enough to keep), then let
    go of the rows kept for it: memory holds one table's rows at a time."""
    if report.compared:
        found = differences(report.source, report.silver)
        report.missing, report.extra, report.different = (found.missing, found.extra,
                                                          found.different)
    report.source.kept = report.silver.kept = None


def compare_with_source(dsn: str, ctx: TableContext, slot: str, publication: str, *,
                        max_pending_bytes: int = 256 << 20, keep_limit: int = 200_000,
                        flush_timeout_s: float = 30.0) -> ConsistencyReport:
    """Compare the table's silver with the source (see the module docstring)."""
    return compare_tables(dsn, [ctx], slot, publication, max_pending_bytes=max_pending_bytes,
                          keep_limit=keep_limit, flush_timeout_s=flush_timeout_s)[0]


COMPARE_ERRORS = (PgCdcError, psycopg2.Error, DeltaError, OSError)
"""Failures that leave one table not compared (with the reason), not the others."""


def compare_tables(dsn: str, contexts: Sequence[TableContext], slot: str, publication: str, *,
                   max_pending_bytes: int = 256 << 20, keep_limit: int = 200_000,
                   flush_timeout_s: float = 30.0,
                   facts: Sequence[TableFacts] | None = None) -> list[ConsistencyReport]:
    """Compare many tables' silver with the source, in the contexts' order.

    What every table shares is done once for all of them (a sweep of 1,000 tables
    in seconds): the slot's lock, one connection for the slot, one REPEATABLE READ snapshot
    of the source at one WAL position, one flush, one peek of the pending changes. Then each
    table's source rows are read in that snapshot and its silver at the version pinned
    before; a table that fails is reported not compared (with why), the others go on.
    ``facts``: the tables' Delta versions and silver schemas read beforehand
    (:func:`~pgcdc_dagster.ops.table_facts.read_all_facts`, shared with the other checks of
    a sweep); read here otherwise.
    """
    reports = [ConsistencyReport(ctx.name) for ctx in contexts]
    pending: list[tuple[TableContext, ConsistencyReport, _Comparison]] = []
    for i, (ctx, report) in enumerate(zip(contexts, reports, strict=True)):
        try:
            cmp = _prepare(ctx, report, keep_limit,
                           facts[i] if facts is not None else read_facts(ctx))
        except COMPARE_ERRORS as exc:
            report.reason = f"could not compare: {explain_error(exc, redact)}"
            continue
        if cmp is not None:
            pending.append((ctx, report, cmp))
    if not pending:
        return reports

    def give_up(reason: str) -> list[ConsistencyReport]:
        for _, report, _ in pending:
            report.reason = reason
        return reports

    with slot_guard_or_reason(dsn, slot) as busy, connection(dsn) as conn:
        if busy is not None:  # it peeks the slot: one reader at a time
            return give_up(busy)
        info = slot_info(conn, slot)
        if info is None or info.confirmed_flush_lsn is None:
            return give_up(f"replication slot {slot!r} does not exist or is invalidated")
        if info.active:
            return give_up(f"replication slot {slot!r} is in use (pid {info.active_pid}); "
                           "retry")
        for ctx, report, _ in pending:
            report.silver_lsn = info.confirmed_flush_lsn
            if not (still_at(ctx.bronze_uri, report.bronze_version)
                    and still_at(ctx.silver_uri, report.silver_version)):
                report.reason = ("bronze or silver changed during the check (a run was "
                                 "capturing); retry")
        pending = [p for p in pending if not p[1].reason]
        if not pending:
            return reports
        snap = ArrowSnapshot(dsn, None, label="consistency check",
                             application_name="pgcdc_dagster check")
        try:
            (position,) = snap.batches("SELECT pg_current_wal_insert_lsn()::text AS lsn")
            source_lsn = Lsn.parse(position.column(0)[0].as_py())
            for _, report, _ in pending:
                report.source_lsn = source_lsn
            backlog = int(source_lsn) - int(info.confirmed_flush_lsn)
            if backlog > max_pending_bytes:
                return give_up(f"the slot is {backlog} bytes behind the source (limit "
                               f"{max_pending_bytes}): run cdc_microbatch, then the check")
            if not _wait_flushed(conn, source_lsn, flush_timeout_s):
                return give_up(f"WAL up to {source_lsn} was not flushed in time")
            try:
                window = peek_window(conn, slot, publication, source_lsn)
            except (psycopg2.errors.ObjectInUse, SlotInUseError) as exc:
                return give_up(f"replication slot {slot!r} is in use: {exc}")
            after = slot_info(conn, slot)
            if after is None or after.confirmed_flush_lsn != info.confirmed_flush_lsn:
                return give_up("the slot moved during the check (a run was capturing); retry")
            # Silver is read and hashed on a thread while the source's COPY runs.
            with ThreadPoolExecutor(1, thread_name_prefix="pgcdc-silver") as reader:
                for ctx, report, cmp in pending:
                    try:
                        if _exclude_pending(ctx, report, cmp,
                                            window.tables.get(ctx.relation.qualified, [])):
                            _digest_both(reader, snap, ctx, report, cmp)
                            report.compared = True
                    except COMPARE_ERRORS as exc:
                        report.reason = f"could not compare: {explain_error(exc, redact)}"
                    _samples(report)
        finally:
            snap.close()  # ends the transaction
    return reports


def _prepare(ctx: TableContext, report: ConsistencyReport, keep_limit: int,
             facts: TableFacts) -> _Comparison | None:
    """The columns both sides have, from silver's schema; None (with the reason) when the
    table cannot be compared now."""
    if facts.bronze_version is None or facts.silver_schema is None:
        report.reason = "bronze or silver does not exist yet: run the initial_snapshot job"
        return None
    applied = facts.silver_applied
    report.bronze_version = facts.bronze_version
    # Upkeep's bronze compactions and vacuums after what silver applied change no rows.
    if applied is None or facts.bronze_last_data is None or applied < facts.bronze_last_data:
        report.reason = (f"silver applied bronze up to version {applied}, bronze is at "
                         f"{report.bronze_version}: materialize silver first")
        return None
    report.silver_version = facts.silver_version
    silver_schema = facts.silver_schema
    by_name = {c.name: conv for c, conv in zip(ctx.relation.columns, ctx.converters,
                                                strict=True)}
    fields, convs = [], []
    for name, conv in by_name.items():
        if name not in silver_schema.names:
            report.skipped_columns.append(name)
            continue
        typ = silver_schema.field(name).type
        try:
            pa.array([], conv.silver_field.type).cast(typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            report.skipped_columns.append(name)
            continue
        fields.append(pa.field(name, typ))
        convs.append(conv)
    target = pa.schema(fields)
    missing_keys = [k for k in ctx.relation.key_names if k not in target.names]
    if missing_keys:
        report.reason = f"key columns {missing_keys} cannot be compared (schema drift)"
        return None
    report.columns = list(target.names)
    return _Comparison(ctx, report, target, convs, keep_limit, facts)


def _exclude_pending(ctx: TableContext, report: ConsistencyReport, cmp: _Comparison,
                     segments: Sequence[TableChanges]) -> bool:
    """Leave out the keys changed after silver's position; False (with the reason) when a
    pending TRUNCATE makes the comparison meaningless."""
    images: list[tuple[object, ...]] = []
    for seg in segments:
        report.pending_events += len(seg)
        if "t" in seg.op:
            report.reason = (f"a TRUNCATE of {ctx.name} is pending in the slot: run "
                             "cdc_microbatch, then the check")
            return False
        images.extend(_key_images(seg, ctx.relation.key_names))
    cmp.exclude(images)
    return True


def _digest_both(reader: ThreadPoolExecutor, snap: ArrowSnapshot,
                 ctx: TableContext, report: ConsistencyReport, cmp: _Comparison) -> None:
    """Hash silver (on ``reader``'s thread) and the source rows (read in ``snap``'s
    REPEATABLE READ transaction: every table at the same point, on one connection; a failed
    read leaves the next tables a usable transaction); raise the first failure."""
    def silver() -> None:
        for batch in cmp.silver_batches():
            cmp.digest(report.silver, batch)

    silver_digest = reader.submit(silver)
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in report.columns),
        sql.Identifier(ctx.relation.namespace, ctx.relation.name))
    try:
        for text in snap.batches(text_select(query, report.columns), label=ctx.name,
                                 savepoint=True):
            cmp.digest(report.source, cmp.source_batch(text))
    finally:
        wait([silver_digest])  # it reads this table's report and comparison
    silver_digest.result()
