"""What the checks need of a table's bronze and silver Delta tables, read with one open each.

The checks of one table read the same two Delta logs: the schema check silver's schema, the
LSN-window check bronze's history and app transaction, the comparison both versions and
silver's app transaction. A sweep over many tables reads them once per table
(:func:`read_facts`), on a few threads (:func:`read_all_facts`: an open replays the log in
delta-rs, outside the GIL), and keeps only these few values (and silver's list of data
files, which the comparison reads at the same version), not the opened tables, so memory
does not grow with the tables' sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable

from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.lake.delta import committed_version, last_data_version, open_table
from pgcdc_dagster.lake.storage import filesystem, join
from pgcdc_dagster.ops.lsn_windows import BronzeCommit, capture_commits

FACT_THREADS = 4
"""Threads opening Delta tables for a sweep (the log replay is Rust, I/O bound on object
stores)."""


@dataclass(frozen=True)
class TableFacts:
    """A table's bronze and silver as the checks need them (None: the table does not exist)."""

    bronze_version: int | None = None
    bronze_applied: int | None = None
    """Bronze's app transaction: the last window end (LSN) written."""
    bronze_last_data: int | None = None
    """Bronze's latest version that may change rows, looking back to what silver applied
    (:func:`~pgcdc_dagster.lake.delta.last_data_version`); None when silver applied nothing."""
    commits: list[BronzeCommit] = field(default_factory=list)
    """Bronze's capture commits among the last ``history_limit`` (oldest first)."""
    silver_version: int | None = None
    silver_applied: int | None = None
    """Silver's app transaction: the bronze version it applied."""
    silver_schema: pa.Schema | None = None
    silver_files: tuple[str, ...] | None = None
    """Silver's data files at ``silver_version`` as the log names them (relative to the
    table root), for reading that version without opening the table again; None when the
    files alone do not make the table (a protocol above reader v1: deletion vectors or
    column mapping; partition columns): read it through delta-rs then."""


def still_at(uri: str, version: int | None) -> bool:
    """True when the table's latest version is still ``version``: its commit file is there
    and the next one is not (commits are numbered one by one). Two stats (HEADs on an object
    store) instead of a log replay, for checking that nothing committed meanwhile."""
    if version is None:
        return False
    fs, path = filesystem(uri)
    log = join(path, "_delta_log")
    current, following = fs.get_file_info([join(log, f"{version:020d}.json"),
                                           join(log, f"{version + 1:020d}.json")])
    return bool(current.type == pafs.FileType.File
                and following.type == pafs.FileType.NotFound)


def read_facts(ctx: TableContext, history_limit: int = 0) -> TableFacts:
    """Open the table's silver, then its bronze, once each (``history_limit``: how many
    bronze log entries to read for the LSN-window check; 0 reads none)."""
    silver = open_table(ctx.silver_uri)
    bronze = open_table(ctx.bronze_uri)
    silver_applied = committed_version(silver, ctx.silver_app_id)
    return TableFacts(
        bronze_version=bronze.version() if bronze is not None else None,
        bronze_applied=committed_version(bronze, ctx.bronze_app_id),
        bronze_last_data=last_data_version(bronze, silver_applied)
        if bronze is not None and silver_applied is not None else None,
        commits=capture_commits(bronze, history_limit)
        if bronze is not None and history_limit > 0 else [],
        silver_version=silver.version() if silver is not None else None,
        silver_applied=silver_applied,
        silver_schema=pa.schema(silver.schema().to_arrow()) if silver is not None else None,
        silver_files=plain_files(silver) if silver is not None else None)


def plain_files(table: DeltaTable) -> tuple[str, ...] | None:
    """The table's data files when reading them as plain Parquet reads the table."""
    if table.protocol().min_reader_version > 1 or table.metadata().partition_columns:
        return None
    root = table.table_uri.removeprefix("file://").rstrip("/") + "/"
    uris = table.file_uris()
    if all(u.startswith(root) for u in uris):  # the cheap way (no Arrow table of actions)
        return tuple(u[len(root):] for u in uris)
    return tuple(pa.table(table.get_add_actions(flatten=False))["path"].to_pylist())


def read_all_facts(contexts: Sequence[TableContext], history_limit: int,
                   errors: tuple[type[Exception], ...],
                   threads: int = FACT_THREADS) -> list[TableFacts | Exception]:
    """:func:`read_facts` of every table, in the contexts' order; a table whose logs cannot
    be read (one of ``errors``) gets the exception instead, the others go on."""
    def one(ctx: TableContext) -> TableFacts | Exception:
        try:
            return read_facts(ctx, history_limit)
        except errors as exc:
            return exc

    read: Callable[[TableContext], TableFacts | Exception] = one
    if len(contexts) <= 1 or threads <= 1:
        return [read(c) for c in contexts]
    with ThreadPoolExecutor(threads, thread_name_prefix="pgcdc-facts") as pool:
        return list(pool.map(read, contexts))
