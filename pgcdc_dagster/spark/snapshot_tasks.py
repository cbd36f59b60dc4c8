"""Snapshot chunks as Spark tasks: each task reads one chunk inside an exported snapshot and
writes one bronze Parquet file and the silver files (clustered by key at the target file
size, :class:`_ClusteredOutput`) straight into the Delta table directories.

A chunk is read as Arrow record batches (:mod:`pgcdc_dagster.postgres.arrow_reader`, ADBC's
PostgreSQL driver, plain or TLS alike) and converted with Arrow compute
(:mod:`pgcdc_dagster.capture.snapshot_arrow`) and written one row group (about
``row_group_bytes`` of Arrow data) at a time, so memory per task is bounded by a few row
groups whatever the chunk's size. The driver commits the
returned files through delta-rs; a task never commits.

Chunks of small tables share a task (:class:`ChunkGroup`, planned by
:func:`group_small`): a thousand tables of a thousand rows are a few dozen Spark tasks, not a
thousand, and each task reads its chunks one after the other in one transaction that
imported the exported snapshot (:class:`SharedTransaction`: one connection per group, not per
table).

Errors the user can act on (a type the configured mode cannot convert, a table that
vanished, an expired snapshot) come back as :class:`ChunkError` values instead of Spark task
failures, so the driver re-raises them with their own type and message.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg2
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from psycopg2 import sql

from pgcdc_dagster import exceptions
from pgcdc_dagster.capture.snapshot_arrow import arrow_select, convert_batch, native_kind
from pgcdc_dagster.capture.snapshot_convert import ChunkConverter
from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.lake.file_stats import delta_stats as stats_json
from pgcdc_dagster.lake.parquet_layout import SAMPLE_ROWS
from pgcdc_dagster.lake.storage import filesystem
from pgcdc_dagster.postgres import snapshot_read
from pgcdc_dagster.postgres.arrow_reader import ArrowSnapshot, read_batches
from pgcdc_dagster.postgres.snapshot_read import Chunk, KeyColumn, chunk_query

ROW_GROUP_BYTES = 8 << 20
"""Text bytes converted and written as one Parquet row group."""


@dataclass(frozen=True)
class ChunkTask:
    """Everything one Spark task needs (it is pickled to the worker)."""

    dsn: str
    snapshot_name: str | None
    chunk: Chunk
    relation: Relation
    converters: tuple[ColumnConverter, ...]
    bronze_schema: pa.Schema
    silver_schema: pa.Schema
    key: tuple[KeyColumn, ...]
    override: str | None
    bronze_root: str
    silver_root: str
    ident: SourceIdentity
    lsn: int
    """The consistent point the chunk is read at: the rows' sequence."""
    processed_ms: int
    first_marker: str | None = None
    """``source.snapshot`` of the chunk's first row (``first``/``first_in_data_collection``)."""
    last_marker: str | None = None
    """``source.snapshot`` of the chunk's last row (``last``/``last_in_data_collection``)."""
    block_size: int = snapshot_read.CSV_BLOCK_BYTES
    row_group_bytes: int = ROW_GROUP_BYTES
    file_prefix: str = "snap"
    binary: bool = True
    """Read the columns :mod:`~pgcdc_dagster.capture.snapshot_arrow` can take natively as
    Arrow values; False: every column as its text output (the same reader)."""
    statement_timeout_ms: int = 0
    """``statement_timeout`` of the chunk's read (set for an override's chunks; 0: none)."""
    silver_file_bytes: int = 0
    """Target size of the chunk's silver files (``target_file_bytes``): the chunk is read in
    key order and its silver rows written as files of about this size, each sorted by key
    (:class:`_ClusteredOutput`); 0: one silver file per chunk, in read order."""
    storage: dict[str, str] | None = None
    """Storage options of an object-store lakehouse (``lake.storage``), resolved on the
    driver: the executor writes through pyarrow's own filesystem with them. Secrets: never
    printed (see ``__repr__``)."""

    def __repr__(self) -> str:  # never print the DSN
        return f"ChunkTask({self.chunk})"

    def __getstate__(self) -> dict[str, Any]:
        """The schemas travel as Arrow IPC bytes: a tenth of the CPU of pickling them field
        by field, on the driver and in the worker (a thousand small tables)."""
        state = dict(self.__dict__)
        for name in _SCHEMAS:
            state[name] = state[name].serialize().to_pybytes()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name in _SCHEMAS:
            state[name] = pa.ipc.read_schema(pa.py_buffer(state[name]))
        self.__dict__.update(state)


_SCHEMAS = ("bronze_schema", "silver_schema")
"""The :class:`ChunkTask` fields pickled as Arrow IPC."""


@dataclass(frozen=True)
class ChunkGroup:
    """Chunks of small tables read one after the other by one Spark task."""

    tasks: tuple[ChunkTask, ...]

    def __repr__(self) -> str:
        return f"ChunkGroup({len(self.tasks)} chunks)"


Unit = ChunkTask | ChunkGroup
"""What one Spark task runs: a chunk, or a group of small tables' chunks."""

SMALL_TABLE_FRACTION = 8
"""A single-chunk table of at most ``chunk_bytes / SMALL_TABLE_FRACTION`` heap is small."""
GROUP_MAX_CHUNKS = 64
"""Chunks of one group at most: the driver commits a group's tables when its task ends, so
groups stay small enough for results to flow while the other tasks run."""
FIRST_GROUP_CHUNKS = 8
"""Chunks of each of the first small-table groups (one per slot, when no big chunk runs
first): their tables are the first the driver can commit and the run can report, soon after
the workers start, while the bigger groups are read."""


def chunks_of(unit: Unit) -> tuple[ChunkTask, ...]:
    return unit.tasks if isinstance(unit, ChunkGroup) else (unit,)


def group_small(tasks: Sequence[ChunkTask], sizes: Sequence[int], *, chunk_bytes: int,
                slots: int) -> list[Unit]:
    """The tasks as Spark task units: chunks of big tables alone, first (they take longest),
    then the small tables' chunks (``sizes[i]``: heap bytes of ``tasks[i]``'s table, or -1
    for a chunk of a table read in several) packed into groups of at most ``chunk_bytes``
    heap and :data:`GROUP_MAX_CHUNKS` chunks, and at least ``slots`` groups when there are
    that many small tables, so every core stays busy. Groups are filled largest table first,
    each into the group holding the fewest bytes. With no big chunk to run first, the first
    ``slots`` groups' first :data:`FIRST_GROUP_CHUNKS` chunks are groups of their own, run
    first: the run reports its first tables soon after the workers start."""
    limit = max(1, chunk_bytes // SMALL_TABLE_FRACTION)
    alone: list[Unit] = []
    small: list[tuple[int, ChunkTask]] = []
    for task, size in zip(tasks, sizes, strict=True):
        if 0 <= size <= limit:
            small.append((size, task))
        else:
            alone.append(task)
    if len(small) <= 1:
        return alone + [t for _, t in small]
    total = sum(size for size, _ in small)
    count = max(-(-total // max(chunk_bytes, 1)), -(-len(small) // GROUP_MAX_CHUNKS),
                min(max(1, slots), len(small)))
    bins: list[list[ChunkTask]] = [[] for _ in range(count)]
    loads = [0] * count
    for size, task in sorted(small, key=lambda item: -item[0]):
        i = min(range(count), key=lambda j: (len(bins[j]) >= GROUP_MAX_CHUNKS, loads[j]))
        bins[i].append(task)
        loads[i] += max(size, 1)
    # The first wave's groups cut short (their heads run first): results flow at once.
    heads = [b[:FIRST_GROUP_CHUNKS] for b in bins[:slots]] if not alone else []
    bins = heads + [b[len(h):] for b, h in zip(bins[:len(heads)], heads, strict=True)] + \
        bins[len(heads):]
    groups: list[Unit] = [ChunkGroup(tuple(b)) if len(b) > 1 else b[0] for b in bins if b]
    return alone + groups


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    """A Parquet file a task wrote under a table root (not yet in the Delta log)."""

    path: str
    """Relative to the table root."""
    size: int
    num_records: int
    stats: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "num_records": self.num_records,
                "stats": self.stats}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotFile:
        return cls(str(data["path"]), int(data["size"]), int(data["num_records"]),
                   str(data["stats"]))


@dataclass(frozen=True, slots=True)
class ChunkError:
    """An error the user can act on, raised again on the driver with its type."""

    kind: str
    message: str

    def exception(self) -> Exception:
        cls = getattr(exceptions, self.kind, None) or getattr(snapshot_read, self.kind, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            return cls(self.message)
        return exceptions.PgCdcError(f"{self.kind}: {self.message}")


@dataclass(frozen=True)
class ChunkResult:
    """Files one task wrote, and how many rows; or the error that stopped it."""

    chunk: Chunk
    lsn: int
    rows: int
    bronze: SnapshotFile | None
    silver: tuple[SnapshotFile, ...]
    seconds: float
    error: ChunkError | None = None
    executor: str = ""
    """``host:pid`` of the Spark Python worker that read the chunk ("": this process)."""


class _Output:
    """One Parquet file under a table root, opened on the first row group."""

    def __init__(self, root: str, name: str, schema: pa.Schema,
                 options: Callable[[], dict[str, Any]],
                 storage: dict[str, str] | None = None) -> None:
        self.fs, base = filesystem(root, storage)
        self.name = name
        self.path = f"{base.rstrip('/')}/{name}"
        self.schema = schema
        self.options = options
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, self.schema, filesystem=self.fs,
                                           **self.options())
        self.writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self.rows += table.num_rows

    def close(self) -> SnapshotFile | None:
        if self.writer is None:
            return None
        self.writer.close()
        meta = self.writer.writer.metadata
        size = self.fs.get_file_info(self.path).size
        return SnapshotFile(self.name, int(size or 0), self.rows, stats_json(meta, self.rows))

    def abort(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
                self.fs.delete_file(self.path)
            except OSError:
                pass


def run_chunk(task: ChunkTask, shared: SharedTransaction | None = None) -> ChunkResult:
    """Read one chunk and write its bronze and silver Parquet files (runs on a worker);
    ``shared``: read it in the transaction the chunks of its group share."""
    started = time.monotonic()
    try:
        return _run_chunk(task, started, shared)
    except exceptions.PgCdcError as exc:
        message, table = str(exc), f"{task.chunk.schema}.{task.chunk.table}"
        if table not in message:  # e.g. a converter's error names the column, not the table
            message = f"{table}: {message}"
        return ChunkResult(task.chunk, task.lsn, 0, None, (), time.monotonic() - started,
                           ChunkError(type(exc).__name__, message))
    except psycopg2.Error as exc:
        message = (exc.pgerror or str(exc) or type(exc).__name__).strip()
        return ChunkResult(task.chunk, task.lsn, 0, None, (), time.monotonic() - started,
                           ChunkError("PgCdcError", f"{task.chunk}: {message}"))


def _run_chunk(task: ChunkTask, started: float, shared: SharedTransaction | None
               ) -> ChunkResult:
    conv = ChunkConverter(task.relation, task.converters, task.ident,
                          bronze_schema=task.bronze_schema, silver_schema=task.silver_schema,
                          lsn=task.lsn, processed_ms=task.processed_ms)
    name = f"part-{task.file_prefix}-{task.chunk.index:05d}-{uuid.uuid4().hex}.parquet"
    bronze = _Output(task.bronze_root, name, conv.bronze_writer_schema,
                     lambda: conv.bronze_options, task.storage)
    keys = silver_keys(task)
    silver: _Output | _ClusteredOutput = _Output(
        task.silver_root, name, conv.silver_writer_schema, lambda: conv.silver_options,
        task.storage) if not task.silver_file_bytes else _ClusteredOutput(
        task.silver_root, name, conv.silver_writer_schema, lambda: conv.silver_options,
        task.storage, keys, task.silver_file_bytes)
    columns = [c.name for c in task.relation.columns]
    ordered = bool(task.silver_file_bytes) and \
        [k.name for k in task.key] == list(task.relation.key_names)
    query = chunk_query(task.chunk, columns, task.key, task.override, ordered=ordered)
    groups = _arrow_groups(task, conv, query, columns, shared)
    try:
        first = True
        for (pairs, n), last in _with_last(groups):
            b, s = conv.assemble(pairs, n, first_marker=task.first_marker if first else None,
                                 last_marker=task.last_marker if last else None)
            first = False
            bronze.write(b)
            silver.write(s)
        b_file, s_file = bronze.close(), silver.close()
    except BaseException:
        bronze.abort()
        silver.abort()
        raise
    rows = b_file.num_records if b_file is not None else 0
    s_files = s_file if isinstance(s_file, tuple) else () if s_file is None else (s_file,)
    return ChunkResult(task.chunk, task.lsn, rows, b_file, s_files,
                       time.monotonic() - started)


def silver_keys(task: ChunkTask) -> list[str]:
    """Silver's names of the table's key columns (the MERGE key)."""
    names = {c.name: conv.silver_field.name
             for c, conv in zip(task.relation.columns, task.converters, strict=True)}
    return [names[k] for k in task.relation.key_names if k in names]


class _ClusteredOutput:
    """A chunk's silver rows as files of about ``target_bytes`` each, one row group per file,
    each sorted by key, like compaction's (``lake/data_files.write_clustered``).

    The chunk is read in key order (``chunk_query(ordered=True)``), so consecutive files hold
    consecutive key ranges; rows that are not (a key whose PostgreSQL order is not silver's,
    e.g. an enum) are sorted file by file, and the files' ranges may then overlap, which
    upkeep's compaction repairs. Rows per file come from the first rows' encoded size (once
    more than ``target_bytes`` are held in memory: a small chunk is one file, unestimated),
    then from the files written. Up to 1.5 files of rows are held (a chunk's last file takes
    the remainder up to 1.5 times the target, so no file but a small chunk's is below half
    the target).
    """

    def __init__(self, root: str, name: str, schema: pa.Schema,
                 options: Callable[[], dict[str, Any]], storage: dict[str, str] | None,
                 keys: Sequence[str], target_bytes: int) -> None:
        self.fs, base = filesystem(root, storage)
        self.base = base.rstrip("/")
        self.stem = name.removesuffix(".parquet")
        self.schema = schema
        self.options = options
        self.keys = list(keys)
        self.target_bytes = target_bytes
        self.rows_per_file = 0
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.pending_bytes = 0
        """In memory, until the first estimate: a small table's chunk (its rows less than
        ``target_bytes`` in memory, so less encoded) is written as one file without one."""
        self.files: list[SnapshotFile] = []

    def write(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.pending_rows += table.num_rows
        if not self.rows_per_file:
            self.pending_bytes += table.nbytes
            if self.pending_bytes < self.target_bytes:
                return  # so far less than a file in memory, less encoded: no estimate yet
            self.rows_per_file = self._estimate(self.pending[0])
        while self.pending_rows >= self.rows_per_file * 3 // 2:
            data = pa.concat_tables(self.pending)
            self._write_file(data.slice(0, self.rows_per_file))
            rest = data.slice(self.rows_per_file)
            self.pending, self.pending_rows = [rest], rest.num_rows
            written = sum(f.num_records for f in self.files)
            per_row = sum(f.size for f in self.files) / max(written, 1)
            self.rows_per_file = max(1, int(self.target_bytes / max(per_row, 1e-3)))

    def _estimate(self, table: pa.Table) -> int:
        """Rows per file from the encoded size of the first rows."""
        sample = table.slice(0, SAMPLE_ROWS)
        sink = pa.BufferOutputStream()
        pq.write_table(sample, sink, row_group_size=max(sample.num_rows, 1), **self.options())
        per_row = sink.getvalue().size / max(sample.num_rows, 1)
        return max(1, int(self.target_bytes / max(per_row, 1e-3)))

    def _write_file(self, data: pa.Table) -> None:
        data = _key_sorted(data, self.keys)
        name = f"{self.stem}-{len(self.files):04d}.parquet"
        path = f"{self.base}/{name}"
        collector: list[pq.FileMetaData] = []
        pq.write_table(data, path, filesystem=self.fs, metadata_collector=collector,
                       row_group_size=max(data.num_rows, 1), **self.options())
        size = self.fs.get_file_info(path).size
        self.files.append(SnapshotFile(name, int(size or 0), data.num_rows,
                                       stats_json(collector[0], data.num_rows, data)))

    def close(self) -> tuple[SnapshotFile, ...]:
        if self.pending_rows:
            self._write_file(pa.concat_tables(self.pending))
            self.pending, self.pending_rows = [], 0
        return tuple(self.files)

    def abort(self) -> None:
        for f in self.files:
            try:
                self.fs.delete_file(f"{self.base}/{f.path}")
            except OSError:
                pass


def _key_sorted(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``table`` sorted by ``keys`` (as it is when a single key is already in order)."""
    if table.num_rows < 2 or not keys:
        return table
    if len(keys) == 1:
        first = table.column(keys[0])
        if first.null_count == 0 and pc.all(pc.less_equal(
                first.slice(0, len(first) - 1), first.slice(1))).as_py():
            return table
    return table.sort_by([(k, "ascending") for k in keys])


Converted = tuple[list[tuple[pa.Array, pa.Array]], int]
"""One row group: each column's ``(bronze, silver)`` values, and the row count."""
_T = TypeVar("_T")


def _with_last(items: Iterator[_T]) -> Iterator[tuple[_T, bool]]:
    """The items, each with whether it is the last one (one item read ahead)."""
    it = iter(items)
    try:
        held = next(it)
    except StopIteration:
        return
    for item in it:
        yield held, False
        held = item
    yield held, True


def _arrow_groups(task: ChunkTask, conv: ChunkConverter, query: sql.Composable,
                  columns: list[str], shared: SharedTransaction | None = None
                  ) -> Iterator[Converted]:
    """Row groups of about ``row_group_bytes`` Arrow bytes, read through the Arrow reader
    (``postgres/arrow_reader.py``) in batches of ``block_size`` (``snapshot.fetch.size``
    rows) and converted column-wise (``snapshot_arrow``)."""
    kinds = [native_kind(c) if task.binary else None for c in task.converters]
    select = arrow_select(query, columns, kinds)
    pending: list[pa.RecordBatch] = []
    pending_bytes = 0

    def group() -> Converted:
        batch = pending[0] if len(pending) == 1 else \
            pa.Table.from_batches(pending).combine_chunks().to_batches()[0]
        pending.clear()
        pairs = convert_batch(task.converters, kinds, batch)
        conv.plan_dictionary([b for b, _ in pairs])
        return pairs, batch.num_rows

    for batch in read_batches(task.dsn, task.snapshot_name, select, label=str(task.chunk),
                              batch_bytes=min(task.block_size, task.row_group_bytes),
                              statement_timeout_ms=task.statement_timeout_ms,
                              within=None if shared is None else shared.connection(task)):
        if batch.num_rows == 0:
            continue
        if pending and pending_bytes + batch.nbytes > task.row_group_bytes:
            yield group()
            pending_bytes = 0
        pending.append(batch)
        pending_bytes += batch.nbytes
    if pending:
        yield group()




class SharedTransaction:
    """The snapshot transaction the chunks of a group (small tables) read in, one after the
    other: one connection, snapshot import and set of session settings per group instead of
    per chunk (a thousand small tables paid a thousand connections). Opened by
    the first chunk that needs it; dropped after a chunk's error (its transaction may be
    aborted, or its reply half read), so the next chunk opens another. A statement_timeout
    one chunk's read set (an override's) is reset before the next chunk's."""

    def __init__(self) -> None:
        self.reader: ArrowSnapshot | None = None

    def connection(self, task: ChunkTask) -> ArrowSnapshot:
        if self.reader is None:
            self.reader = ArrowSnapshot(task.dsn, task.snapshot_name, label=str(task.chunk))
        return self.reader

    def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.close()  # closing ends the transaction


def run_unit(unit: Unit) -> list[ChunkResult]:
    """Run a unit's chunks in order (runs on a worker); a group's reads share one
    transaction (:class:`SharedTransaction`)."""
    if isinstance(unit, ChunkTask):
        return [run_chunk(unit)]
    shared = SharedTransaction()
    results: list[ChunkResult] = []
    try:
        for task in unit.tasks:
            try:
                result = run_chunk(task, shared)
            except BaseException:
                shared.close()
                raise
            if result.error is not None:
                shared.close()
            results.append(result)
    finally:
        shared.close()
    return results
