"""What the checks need of a table's bronze and silver Delta tables, read with one open each.

The checks of one table read the same two Delta logs: the schema check silver's schema, the
LSN-window check bronze's history and app transaction, the comparison both versions and
silver's app transaction. A sweep over many tables reads them once per table
(:func:`read_facts`), on a few threads (:func:`read_all_facts`: an open replays the log in
delta-rs, outside the GIL), and keeps only these few values (and silver's list of data
files, which the comparison reads at the same version), not the opened tables, so memory
does not grow with the tables' sizes.

A table this run's snapshot commit just created (or a silver it replaced) needs no read: the
commit knows what it wrote (:class:`CommitFacts`: its version, app transactions, capture
commit, schema and files), and :func:`read_facts` opens only the table it does not know
(a thousand new tables paid three log replays each for their light checks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema

from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.lsn import Lsn
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


@dataclass(frozen=True)
class CreatedBronze:
    """A bronze table a snapshot commit created: version 0, that commit its whole history."""

    offset: int
    """Its app transaction (the snapshot's offset, ``pgcdc.lsn`` of the commit)."""

    @property
    def commits(self) -> list[BronzeCommit]:
        return [BronzeCommit(0, "snapshot", Lsn(self.offset))]


@dataclass(frozen=True)
class WrittenSilver:
    """A silver table as a snapshot commit left it, created or replaced (what
    :func:`read_facts` would read)."""

    version: int
    applied: int
    """Its app transaction: the bronze version it reflects."""
    schema: pa.Schema
    """As a reader gets it back from the log (:func:`logged_schema`)."""
    files: tuple[str, ...] | None
    """As :func:`plain_files` would list them."""


@dataclass(frozen=True)
class CommitFacts:
    """What this run's commits know of a table's bronze and silver (None: read it)."""

    bronze: CreatedBronze | None = None
    silver: WrittenSilver | None = None


def logged_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as a reader gets it back from a Delta log it was committed to (delta-rs
    stores the Delta schema of it: Arrow details Delta lacks are gone)."""
    return pa.schema(DeltaSchema.from_arrow(schema).to_arrow())


def read_facts(ctx: TableContext, history_limit: int = 0,
               known: CommitFacts | None = None) -> TableFacts:
    """Open the table's silver, then its bronze, once each (``history_limit``: how many
    bronze log entries to read for the LSN-window check; 0 reads none); a table ``known``
    holds is not opened."""
    created = known.bronze if known is not None else None
    written = known.silver if known is not None else None
    silver = open_table(ctx.silver_uri) if written is None else None
    bronze = open_table(ctx.bronze_uri) if created is None else None
    if written is not None:
        silver_version: int | None = written.version
        silver_applied: int | None = written.applied
        silver_schema: pa.Schema | None = written.schema
        silver_files = written.files
    else:
        silver_version = silver.version() if silver is not None else None
        silver_applied = committed_version(silver, ctx.silver_app_id)
        silver_schema = pa.schema(silver.schema().to_arrow()) if silver is not None else None
        silver_files = plain_files(silver) if silver is not None else None
    if created is not None:
        # version 0 is its only version: the latest data version whatever silver applied
        return TableFacts(
            bronze_version=0, bronze_applied=created.offset,
            bronze_last_data=0 if silver_applied is not None else None,
            commits=created.commits[-history_limit:] if history_limit > 0 else [],
            silver_version=silver_version, silver_applied=silver_applied,
            silver_schema=silver_schema, silver_files=silver_files)
    return TableFacts(
        bronze_version=bronze.version() if bronze is not None else None,
        bronze_applied=committed_version(bronze, ctx.bronze_app_id),
        bronze_last_data=last_data_version(bronze, silver_applied)
        if bronze is not None and silver_applied is not None else None,
        commits=capture_commits(bronze, history_limit)
        if bronze is not None and history_limit > 0 else [],
        silver_version=silver_version,
        silver_applied=silver_applied,
        silver_schema=silver_schema,
        silver_files=silver_files)


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
                   threads: int = FACT_THREADS,
                   known: Mapping[str, CommitFacts] | None = None
                   ) -> list[TableFacts | Exception]:
    """:func:`read_facts` of every table, in the contexts' order; a table whose logs cannot
    be read (one of ``errors``) gets the exception instead, the others go on. ``known``: what
    this run's commits know, by table name (those tables are not read)."""
    given = known or {}

    def one(ctx: TableContext) -> TableFacts | Exception:
        try:
            return read_facts(ctx, history_limit, given.get(ctx.name))
        except errors as exc:
            return exc

    def opens(ctx: TableContext) -> bool:
        facts = given.get(ctx.name)
        return facts is None or facts.bronze is None or facts.silver is None

    read: Callable[[TableContext], TableFacts | Exception] = one
    if sum(map(opens, contexts)) <= 1 or threads <= 1:
        return [read(c) for c in contexts]
    with ThreadPoolExecutor(threads, thread_name_prefix="pgcdc-facts") as pool:
        return list(pool.map(read, contexts))
