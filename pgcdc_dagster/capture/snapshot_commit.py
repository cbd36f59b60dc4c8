"""Committing a snapshot table through delta-rs: bronze append, silver overwrite, exactly once.

A table's rows enter its Delta tables only when all its chunks are read:

* bronze: one append of every chunk's ``op = r`` file, carrying two app transactions:
  ``(<prefix>:bronze:<table>, offset)`` (the stream skips changes committed before the
  offset, the smallest point the chunks were read at) and ``(<prefix>:snapshot:<table>,
  snapshot id)`` (a resumed run sees the table committed and does not append it twice);
* silver: one **overwrite** with every chunk's silver file (a re-snapshot replaces silver,
  never merges over it), whose app transaction is the bronze version it reflects, so the
  silver catch-up applies only what bronze receives afterwards.

A table the lakehouse does not hold yet is created by that commit (``create_with_files``:
version 0 holds the schema, the files, the app transactions and the snapshot's metadata),
so a first snapshot makes exactly two commits per table (a thousand small tables
paid four, two of them empty table creations). A crash between the two leaves bronze
committed and silver absent; the resumed run finds bronze's snapshot transaction, keeps
its version and creates silver.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.transaction import AddAction, RemoveAction

from pgcdc_dagster.capture.faults import crash_point
from pgcdc_dagster.capture.snapshot_state import ChunkDone
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.lake.delta import (
    DataFile,
    commit_files,
    commit_properties,
    committed_version,
    create_with_files,
    ensure_table,
    first_protocol_of,
    open_table,
)
from pgcdc_dagster.lake.evolution import SchemaChangeError, conflicts, evolve
from pgcdc_dagster.lake.storage import delete_file, join
from pgcdc_dagster.ops.delta_stats import TableStats
from pgcdc_dagster.ops.table_facts import (
    CommitFacts,
    CreatedBronze,
    WrittenSilver,
    logged_schema,
    plain_files,
)
from pgcdc_dagster.spark.snapshot_tasks import SnapshotFile


@dataclass
class TableSnapshotReport:
    """Outcome of the snapshot of one table."""

    table: str
    rows: int
    chunks: int
    bronze_version: int
    silver_version: int
    lsn: int = 0
    """The table's offset: the smallest point its chunks were read at."""
    resumed_chunks: int = 0
    """Chunks read by an earlier, interrupted run and kept."""
    silver_current: bool = False
    """Silver reflects bronze's latest version (its app transaction is bronze's version
    after the commit): the silver catch-up has nothing to apply until bronze grows."""
    bronze_stats: TableStats | None = None
    """Bronze as this commit left it, when the commit created it (its files are all the
    table holds): a report need not read the log back. None: read it."""
    silver_stats: TableStats | None = None
    """Silver as this run's commit left it (created or replaced: its files are all the table
    holds, every row live). None: read it."""
    facts: CommitFacts = field(default_factory=CommitFacts)
    """What the checks would read back of the tables this commit created (bronze, silver)
    or replaced (silver), known without reading them again."""


def snapshot_app_id(app_prefix: str, ctx: TableContext) -> str:
    return f"{app_prefix}:snapshot:{ctx.name}"


def check_bronze_schema(ctx: TableContext) -> None:
    """Refuse, before reading, a snapshot bronze could not store (a column changed type)."""
    existing = open_table(ctx.bronze_uri)
    if existing is None or not existing.file_uris():
        return  # nothing stored yet: the commit sets the schema
    bad = list(conflicts(pa.schema(existing.schema().to_arrow()), ctx.bronze_schema))
    if bad:
        raise SchemaChangeError(
            f"bronze {ctx.name}: column type changed ({', '.join(bad)}); bronze (reader v1 / "
            "writer v2) cannot change a column's type in place. Move the table's bronze "
            "directory aside (or exclude the table), then snapshot it again.")


def commit_table(ctx: TableContext, done: Mapping[int, ChunkDone], *, app_prefix: str,
                 snapshot_id: int, mode: str, resumed: int = 0) -> TableSnapshotReport:
    """Bronze append + silver overwrite of one table's chunks, each exactly once.

    A table new to the lakehouse is created by its snapshot commit (version 0 holds the
    schema, the files and the app transactions): two commits per table, not four.
    """
    lsn = min(c.lsn for c in done.values())
    rows = sum(c.rows for c in done.values())
    snap_app = snapshot_app_id(app_prefix, ctx)
    meta = {"pgcdc.kind": "snapshot", "pgcdc.lsn": str(Lsn(lsn)), "pgcdc.rows": str(rows),
            "pgcdc.snapshot_id": str(snapshot_id), "pgcdc.snapshot_mode": mode,
            "pgcdc.chunks": str(len(done))}
    b_files = [_data_file(c.bronze) for c in done.values() if c.bronze is not None]
    b_props = CommitProperties(
        app_transactions=[Transaction(ctx.bronze_app_id, lsn),
                          Transaction(snap_app, snapshot_id)],
        custom_metadata=meta)
    bronze = create_with_files(ctx.bronze_uri, ctx.bronze_schema, b_files, properties=b_props)
    b_stats: TableStats | None = None
    if bronze is None:
        b_version = latest = 0
        b_stats = files_stats(0, b_files)
        crash_point("snapshot_after_bronze_commit")
    else:
        b_version = _commit_bronze(ctx, bronze, b_files, b_props, snap_app, snapshot_id)
        latest = bronze.version()
    s_files = [_data_file(f) for c in done.values() for f in c.silver]
    silver = create_with_files(ctx.silver_uri, ctx.silver_schema, s_files,
                               properties=commit_properties(ctx.silver_app_id, b_version, meta))
    s_stats: TableStats | None = None
    written: WrittenSilver | None = None
    if silver is None:
        s_version = 0
        s_stats = files_stats(0, s_files)
        written = _written_silver(ctx.silver_schema, b_version, s_files)
    elif version_of(silver, snapshot_id) >= 0:
        s_version = silver.version()
        written = _silver_as_read(silver, committed_version(silver, ctx.silver_app_id))
    else:
        s_version = commit_files(silver, s_files, ctx.silver_schema, mode="overwrite",
                                 app_id=ctx.silver_app_id, version=b_version, metadata=meta)
        s_stats = files_stats(s_version, s_files)
        written = _silver_as_read(silver, b_version)  # the table, updated to its commit
    facts = CommitFacts(CreatedBronze(lsn) if b_stats is not None else None, written)
    return TableSnapshotReport(ctx.name, rows, len(done), b_version, s_version, lsn, resumed,
                               silver_current=latest == b_version, bronze_stats=b_stats,
                               silver_stats=s_stats, facts=facts)


def _silver_as_read(silver: DeltaTable, applied: int | None) -> WrittenSilver | None:
    """Silver as the table object open at its latest version holds it (what a new open
    would read, without one)."""
    if applied is None:
        return None
    return WrittenSilver(silver.version(), applied, pa.schema(silver.schema().to_arrow()),
                         plain_files(silver))


def _written_silver(schema: pa.Schema, applied: int,
                    files: Sequence[DataFile]) -> WrittenSilver | None:
    """Silver as its creating commit wrote it (None when the protocol it got is not known
    here: a reader reads it back)."""
    protocol = first_protocol_of(schema)
    if protocol is None:
        return None
    plain = protocol["minReaderVersion"] == 1  # no partitions either: plain Parquet files
    return WrittenSilver(0, applied, logged_schema(schema),
                         tuple(f.path for f in files) if plain else None)


def files_stats(version: int, files: Sequence[DataFile]) -> TableStats:
    """A table whose version ``version`` holds exactly ``files`` (what :func:`table_stats`
    would read back from its log)."""
    return TableStats(version, len(files), sum(f.size for f in files),
                      sum(f.num_records for f in files), frozenset(f.path for f in files))


def _data_file(f: SnapshotFile) -> DataFile:
    return DataFile(f.path, f.size, f.num_records, f.stats)


def _commit_bronze(ctx: TableContext, bronze: DeltaTable, files: Sequence[DataFile],
                   props: CommitProperties, snap_app: str, snapshot_id: int) -> int:
    """The snapshot's bronze commit to a table that exists: its version (the version that
    holds it already when a resumed run finds the commit made)."""
    if committed_version(bronze, snap_app) == snapshot_id:
        return version_of(bronze, snapshot_id)
    # Columns added since the table was created join its schema (older files read them as
    # null); appending with a schema the log lacks would hide them. A table with no file yet
    # simply takes the snapshot's schema.
    empty = not bronze.file_uris()
    schema = ctx.bronze_schema if empty else evolve(bronze, ctx.bronze_schema,
                                                    f"bronze {ctx.name}")
    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [
        AddAction(f.path, f.size, {}, now, True, f.stats) for f in files]
    bronze.create_write_transaction(actions, "overwrite" if empty else "append", schema,
                                    commit_properties=props)
    bronze.update_incremental()
    crash_point("snapshot_after_bronze_commit")
    return bronze.version()


def commit_empty(ctx: TableContext, point: int, mode: str) -> None:
    """An offset without data (no_data, snapshot.include.collection.list): the table streams
    from ``point``. A table that already has an offset keeps it."""
    meta = {"pgcdc.kind": "snapshot", "pgcdc.lsn": str(Lsn(point)), "pgcdc.rows": "0",
            "pgcdc.snapshot_mode": mode, "pgcdc.no_data": "true"}
    props = commit_properties(ctx.bronze_app_id, point, meta)
    bronze = create_with_files(ctx.bronze_uri, ctx.bronze_schema, [], properties=props)
    ensure_table(ctx.silver_uri, ctx.silver_schema)
    if bronze is not None and committed_version(bronze, ctx.bronze_app_id) is None:
        bronze.create_write_transaction([], "append", ctx.bronze_schema,
                                        commit_properties=props)


def version_of(table: DeltaTable, snapshot_id: int, limit: int = 50) -> int:
    """Version of the table's commit of snapshot ``snapshot_id`` (-1 when not found)."""
    for entry in table.history(limit):
        if entry.get("pgcdc.snapshot_id") == str(snapshot_id):
            return int(entry["version"])
    return -1


def remove_uncommitted(ctx: TableContext, chunks: Mapping[int, ChunkDone]) -> None:
    """Delete the files of chunks that will never be committed (on local disk or object
    storage; one that cannot be deleted stays an orphan that ``vacuum`` removes)."""
    for c in chunks.values():
        for root, f in ((ctx.bronze_uri, c.bronze), *((ctx.silver_uri, s) for s in c.silver)):
            if f is not None:
                delete_file(join(root, f.path))
