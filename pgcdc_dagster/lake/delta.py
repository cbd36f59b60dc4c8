"""Thin, idempotent Delta operations on delta-rs.

Exactly-once (design.md §3, decision 3): every commit that applies a window records an app
transaction ``(app_id, version)``; readers ask :func:`committed_version` and skip what is at
or below it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.commit_safety import ensure_safe_commits
from pgcdc_dagster.lake.disk_full import explaining_full_disk
from pgcdc_dagster.lake.file_stats import delta_stats
from pgcdc_dagster.lake.first_commit import TableExists, first_protocol, write_first_commit
from pgcdc_dagster.lake.paths import is_local
from pgcdc_dagster.lake.storage import filesystem, storage_options

WRITER_FEATURES: Mapping[str, str] = {
    # Keep reader v1 / writer v2: readable by Spark+Delta, delta-rs, DuckDB and Polars.
    "delta.minReaderVersion": "1",
    "delta.minWriterVersion": "2",
}


@dataclass(frozen=True, slots=True)
class DataFile:
    """A Parquet file written inside a table directory, ready to be added to the log."""

    path: str
    """Path relative to the table root."""
    size: int
    num_records: int
    stats: str


_SHARED: ContextVar[OrderedDict[tuple[str, int | None], DeltaTable] | None] = \
    ContextVar("pgcdc_shared_tables", default=None)
SHARED_TABLES = 16
"""Tables :func:`shared_reads` keeps open (the most recently used): reports go table by
table, so memory stays bounded whatever the table count."""


@contextmanager
def shared_reads() -> Iterator[None]:
    """Within the block, :func:`load_table` reuses the tables (at each version) it opened
    last instead of opening them again.

    For reporting many tables' metadata and checks, which read each table several times (an
    open replays the log: milliseconds each, times a thousand tables). Nothing in the block
    may write a table or change a returned DeltaTable (``update_incremental``,
    ``load_as_version``)."""
    token = _SHARED.set(OrderedDict())
    try:
        yield
    finally:
        _SHARED.reset(token)


def load_table(uri: str, version: int | None = None) -> DeltaTable:
    """The table at ``uri`` (at ``version``), with the lakehouse's storage options.

    Every DeltaTable of the package is opened here or by :func:`open_table`, so object-store
    credentials and endpoints (:mod:`pgcdc_dagster.lake.storage`) reach delta-rs.
    """
    shared = _SHARED.get()
    if shared is None:
        return DeltaTable(uri, version=version, storage_options=storage_options(uri))
    table = shared.get((uri, version))
    if table is None:
        table = DeltaTable(uri, version=version, storage_options=storage_options(uri))
        shared[(uri, version)] = table
        shared[(uri, table.version())] = table
        while len(shared) > SHARED_TABLES:
            shared.popitem(last=False)
    else:
        shared.move_to_end((uri, version))
    return table


def open_table(uri: str) -> DeltaTable | None:
    """The table at ``uri``, or None when no Delta table exists there."""
    try:
        return load_table(uri)
    except TableNotFoundError:
        return None


def write_table(uri: str, data: Any, **kwargs: Any) -> None:
    """``write_deltalake`` to ``uri`` with the storage options, after the commit-safety check
    (:mod:`pgcdc_dagster.lake.commit_safety`)."""
    ensure_safe_commits(uri)
    write_deltalake(uri, data, storage_options=storage_options(uri), **kwargs)


def ensure_table(uri: str, schema: pa.Schema) -> DeltaTable:
    """Open the table, creating it empty with ``schema`` when missing."""
    ensure_safe_commits(uri)
    table = open_table(uri)
    if table is not None:
        return table
    if is_local(uri):
        _make_local_dir(uri)
    return DeltaTable.create(uri, schema, mode="ignore", storage_options=storage_options(uri))


def create_with_files(uri: str, schema: pa.Schema, files: Sequence[DataFile], *,
                      properties: CommitProperties) -> DeltaTable | None:
    """Create the table at ``uri`` with ``files`` (written under its root) in its first
    commit, version 0, carrying ``properties`` (app transactions, metadata): one commit where
    :func:`ensure_table` then :func:`commit_files` make two. None once created; when a table
    exists there already, nothing is written and that table is returned (the caller commits
    to it the usual way).

    On local storage the commit is written as delta-rs would write it, without delta-rs's
    create, which also lists the log first and loads the new table back
    (``lake/first_commit.py``); elsewhere, or for a schema whose protocol that
    module does not decide, delta-rs creates it."""
    ensure_safe_commits(uri)
    delta_schema = DeltaSchema.from_arrow(schema)
    if is_local(uri):
        schema_json = delta_schema.to_json()
        protocol = first_protocol(schema_json)
        if protocol is None:
            _make_local_dir(uri)
        else:
            try:
                write_first_commit(
                    uri, schema_json, protocol, [(f.path, f.size, f.stats) for f in files],
                    [(t.app_id, t.version) for t in properties.app_transactions or []],
                    properties.custom_metadata or {})
            except TableExists:
                existing = open_table(uri)
                if existing is not None:
                    return existing
                # the log holds something, but no table: delta-rs decides, as it always did
            except OSError:
                _make_local_dir(uri)  # the ConfigurationError naming the fix, if that is it
                raise
            else:
                return None
    now = int(time.time() * 1000)
    actions = [AddAction(f.path, f.size, {}, now, True, f.stats) for f in files]
    try:
        create_table_with_add_actions(uri, delta_schema, actions, mode="error",
                                      storage_options=storage_options(uri),
                                      commit_properties=properties)
    except DeltaError:
        existing = open_table(uri)
        if existing is not None:
            return existing  # a table was there (or was just created by another writer)
        raise
    return None


def first_protocol_of(schema: pa.Schema) -> dict[str, Any] | None:
    """The protocol :func:`create_with_files` gives a new table of ``schema`` (None: the one
    delta-rs decides)."""
    return first_protocol(DeltaSchema.from_arrow(schema).to_json())


def _make_local_dir(path: str) -> None:
    """Create a local table's directory, or raise a ConfigurationError naming the fix."""
    try:
        os.makedirs(path, exist_ok=True)
        problem = None if os.access(path, os.W_OK | os.X_OK) else "permission denied"
    except OSError as exc:
        problem = exc.strerror or type(exc).__name__
    if problem is not None:
        raise ConfigurationError(
            f"cannot create or write the lakehouse directory {path} ({problem}). Fix: set "
            "PGCDC_LAKEHOUSE (the lakehouse resource's root) to a directory this process may "
            "create and write, or give it write permission there."
        )


def ensure_local_dir(path: str) -> None:
    """:func:`_make_local_dir` for a caller that checks the lakehouse before it changes
    anything at the source."""
    _make_local_dir(path)


def committed_version(table: DeltaTable | None, app_id: str) -> int | None:
    """Version recorded by the last commit of ``app_id`` (None when there is none)."""
    if table is None:
        return None
    return table.transaction_version(app_id)


_SAME_ROWS_OPERATIONS = frozenset({"VACUUM START", "VACUUM END"})


def last_data_version(table: DeltaTable, since: int) -> int:
    """The table's latest version that may change its rows, looking back to ``since``: upkeep
    commits (a compaction, ``pgcdc.kind = compaction``, or a vacuum) carry the same rows, so
    a reader caught up before them is caught up. A version whose log entry is gone counts
    as a data change."""
    current = table.version()
    if current <= since:
        return current
    entries = {h.get("version"): h for h in table.history(current - since)}
    for version in range(current, since, -1):
        entry = entries.get(version)
        if entry is None or not (entry.get("pgcdc.kind") == "compaction"
                                 or entry.get("operation") in _SAME_ROWS_OPERATIONS):
            return version
    return since


def commit_properties(app_id: str, version: int,
                      metadata: Mapping[str, str] | None = None) -> CommitProperties:
    """CommitProperties carrying the app transaction and string metadata."""
    return CommitProperties(
        app_transactions=[Transaction(app_id, version)],
        custom_metadata=dict(metadata or {}),
    )


def append_arrow(uri: str, data: pa.Table, *, app_id: str, version: int,
                 metadata: Mapping[str, str] | None = None) -> int:
    """Append ``data`` with an app transaction; return the new table version."""
    write_table(uri, data, mode="append", schema_mode="merge",
                commit_properties=commit_properties(app_id, version, metadata))
    return load_table(uri).version()


def stats_json(meta: pq.FileMetaData, num_records: int, data: pa.Table | None = None) -> str:
    """Delta file statistics of a Parquet file, ``data`` its rows when at hand
    (``lake/file_stats.py``)."""
    return delta_stats(meta, num_records, data)


def describe_file(table_root: str, relative: str, num_records: int) -> DataFile:
    """Build the DataFile of a Parquet file already written under ``table_root``."""
    fs, base = filesystem(table_root)
    full = f"{base.rstrip('/')}/{relative}"
    size = fs.get_file_info(full).size
    with fs.open_input_file(full) as handle:
        meta = pq.read_metadata(handle)
    return DataFile(relative, int(size or 0), num_records, stats_json(meta, num_records))


def write_part(table_root: str, data: pa.Table, prefix: str = "part") -> DataFile:
    """Write ``data`` as one Parquet file under the table root (local or object store).

    The file is not part of the table until :func:`commit_files` adds it; a crash before
    that leaves an orphan that readers ignore and ``vacuum`` removes.
    """
    name = f"{prefix}-{uuid.uuid4().hex}.parquet"
    fs, base = filesystem(table_root)
    path = f"{base.rstrip('/')}/{name}"
    collector: list[pq.FileMetaData] = []
    with explaining_full_disk(path):
        pq.write_table(data, path, filesystem=fs, compression="zstd",
                       metadata_collector=collector)
    size = fs.get_file_info(path).size
    return DataFile(name, int(size or 0), data.num_rows,
                    stats_json(collector[0], data.num_rows, data))


def commit_files(table: DeltaTable, files: Sequence[DataFile], schema: pa.Schema, *,
                 mode: str, app_id: str, version: int,
                 metadata: Mapping[str, str] | None = None) -> int:
    """Commit Parquet files written into the table directory (``append`` or ``overwrite``).

    ``overwrite`` removes every file the table had: a re-snapshot replaces silver.
    """
    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [
        AddAction(f.path, f.size, {}, now, True, f.stats) for f in files]
    ensure_safe_commits(table.table_uri)
    table.create_write_transaction(actions, mode, schema,
                                   commit_properties=commit_properties(app_id, version, metadata))
    table.update_incremental()
    return table.version()


def file_paths(uri: str, version: int) -> set[str]:
    """Data files of a table version, as paths and URIs pyarrow opens (delta-rs percent-
    encodes them: ``Mixed%20Case``; the stored names are unquoted)."""
    files = load_table(uri, version).file_uris()
    return {unquote(f) for f in files}


COMPACTED_PREFIX = "compact-"
"""Name prefix of the files compaction writes (``lake/upkeep.py``)."""


def new_files(uri: str, since_version: int | None, until_version: int) -> list[str]:
    """Files added to an append-only table after ``since_version`` up to ``until_version``.

    Files compaction wrote hold only events of files that were there at ``since_version``
    (bronze is compacted only among the files silver has applied), so they are not new.
    """
    now = file_paths(uri, until_version)
    if since_version is None or since_version < 0:
        return sorted(now)
    return sorted(f for f in now - file_paths(uri, since_version)
                  if not os.path.basename(f).startswith(COMPACTED_PREFIX))
