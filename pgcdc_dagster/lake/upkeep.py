"""Upkeep of a Delta table: compaction keeping key clustering, vacuum, log checkpoints.

* **Compaction** rewrites, sorted by key, groups of files in key order: files whose key ranges
  overlap (silver: a batch's inserts inside a stored range), silver files over twice the
  target size (a snapshot's chunk files: split), and runs of small files (below half the target
  size) up to the target size. Rows are moved, never changed, and the commit carries no
  app transaction, so the tables' exactly-once markers (``txn`` actions, kept by log replay
  and by checkpoints) are untouched. A micro-batch that committed first and removed one of
  the group's files makes the compaction commit fail (delta-rs checks removed files
  against the read version): the group is left for the next run. The other way round,
  delta-rs 1.6.6 refuses the micro-batch's commit only if the compaction's removals are
  marked ``dataChange = true``: it ignores ``dataChange = false`` removals in its conflict
  check (measured, its own OPTIMIZE included: the stale rewrite commits and the rows of the
  rewritten files are doubled). Silver's compaction commits are therefore
  ``dataChange = true``; the micro-batch then runs again (``lake/silver.py``). Bronze's
  stay ``dataChange = false`` (no writer removes bronze files but compaction; a streaming
  reader of bronze sees no new data).
* Bronze is compacted only among the files silver has already applied (present at the
  bronze version silver's app transaction records), in commit order, and the compacted
  files are named ``compact-…``: silver's catch-up takes the files a bronze version added
  (``lake/delta.py`` :func:`new_files`) and skips those, whose events it has applied.
* **Vacuum** deletes the files that commits removed more than the retention ago (delta-rs
  "lite" vacuum: files never committed are not touched, so a running snapshot's or
  micro-batch's files are safe). Time travel works to any version whose files are all
  within the retention.
* **Checkpoint**: a Parquet checkpoint of the log, so that opening the table reads one file
  and the few commits after it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from pgcdc_dagster.lake.commit_safety import ensure_safe_commits
from pgcdc_dagster.lake.data_files import (
    StoredFile,
    bytes_per_row,
    delete_files,
    read_file,
    rows_per_file,
    stored_files,
    write_clustered,
)
from pgcdc_dagster.lake.delta import (
    COMPACTED_PREFIX,
    DataFile,
    committed_version,
    load_table,
    open_table,
)

COMPACT_PREFIX = COMPACTED_PREFIX.rstrip("-")
SMALL_FRACTION = 0.5
"""A file below this fraction of the target size is small (a compaction candidate)."""
LARGE_FACTOR = 2
"""A file above this many times the target size is split (snapshot chunks are larger)."""
MAX_GROUP_BYTES = 512 << 20
"""Stored bytes of the largest group compaction reads at once (memory bound)."""
BRONZE_ORDER = ("__commit_lsn", "__ordinal")


@dataclass
class CompactionResult:
    """One compaction run of one table."""

    groups: int = 0
    files_removed: int = 0
    bytes_removed: int = 0
    files_added: int = 0
    bytes_added: int = 0
    conflicts: int = 0
    """Groups left for the next run because a concurrent commit removed one of their files."""


def compaction_groups(files: Sequence[StoredFile], target_bytes: int, *,
                      repair_overlaps: bool,
                      max_group_bytes: int = MAX_GROUP_BYTES) -> list[list[StoredFile]]:
    """Groups of files to rewrite together, in key order (module docstring).

    Files without statistics for the first key are binned in log order after the others.
    """
    ranged = sorted((f for f in files if f.rows != 0 and f.low is not None
                     and f.high is not None), key=lambda f: (f.low, f.high))
    components: list[list[StoredFile]] = []
    high: Any = None
    for f in ranged:
        if repair_overlaps and components and f.low <= high:
            components[-1].append(f)
            high = max(high, f.high)
        else:
            components.append([f])
            high = f.high
    components += [[f] for f in files if f.rows != 0 and (f.low is None or f.high is None)]
    small = target_bytes * SMALL_FRACTION
    groups: list[list[StoredFile]] = []
    run: list[StoredFile] = []
    run_bytes = 0
    for comp in components:
        size = sum(f.size for f in comp)
        if len(comp) > 1 or (repair_overlaps and size > target_bytes * LARGE_FACTOR):
            # Overlapping ranges, rewritten together sorted; or a silver file far above the
            # target (a snapshot's chunk), split (bronze is never merged into: left whole).
            # A group is read whole: one larger than the memory bound is left as it is.
            if size <= max_group_bytes:
                groups.append(comp)
            continue
        if size >= small or run_bytes + size > target_bytes:
            if len(run) > 1:
                groups.append(run)
            run, run_bytes = [], 0
        if size < small:
            run.append(comp[0])
            run_bytes += size
    if len(run) > 1:
        groups.append(run)
    return groups


def compact(uri: str, keys: Sequence[str], target_bytes: int, *,
            eligible: set[str] | None = None, repair_overlaps: bool = True,
            data_change: bool = True, now_ms: int | None = None) -> CompactionResult:
    """Compact the table at ``uri`` (module docstring); ``eligible`` limits the files
    considered (bronze: those silver has applied). ``data_change`` is the flag of the
    commit's actions (module docstring: why silver's are true). ``now_ms`` is the removal
    time recorded (vacuum's clock)."""
    result = CompactionResult()
    table = open_table(uri)
    if table is None:
        return result
    files = stored_files(table, keys[0])
    if eligible is not None:
        files = [f for f in files if f.path in eligible]
    per_file = rows_per_file(target_bytes, bytes_per_row(files))
    schema = pa.schema(table.schema().to_arrow())
    for group in compaction_groups(files, target_bytes, repair_overlaps=repair_overlaps):
        data = pa.concat_tables([read_file(uri, f.path, schema) for f in group])
        added = write_clustered(uri, data, keys, per_file, COMPACT_PREFIX)
        if not _commit_rewrite(table, group, added, data_change, now_ms):
            delete_files(uri, added)
            result.conflicts += 1
            table.update_incremental()
            continue
        result.groups += 1
        result.files_removed += len(group)
        result.bytes_removed += sum(f.size for f in group)
        result.files_added += len(added)
        result.bytes_added += sum(f.size for f in added)
    return result


def _commit_rewrite(table: DeltaTable, removed: Sequence[StoredFile],
                    added: Sequence[DataFile], data_change: bool, now_ms: int | None) -> bool:
    """Swap ``removed`` for ``added`` (same rows): False when a concurrent commit won."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [
        RemoveAction(f.path, data_change, now, f.size, {}) for f in removed]
    actions += [AddAction(f.path, f.size, {}, now, data_change, f.stats) for f in added]
    ensure_safe_commits(table.table_uri)
    try:
        table.create_write_transaction(
            actions, "append", table.schema(),
            commit_properties=CommitProperties(custom_metadata={
                "pgcdc.kind": "compaction", "pgcdc.files_removed": str(len(removed))}))
    except CommitFailedError:
        return False
    table.update_incremental()
    return True


def vacuum(uri: str, retention_hours: int) -> int:
    """Delete files removed more than ``retention_hours`` ago; return how many."""
    table = open_table(uri)
    if table is None:
        return 0
    deleted = table.vacuum(retention_hours=retention_hours, dry_run=False,
                           enforce_retention_duration=False)
    return len(deleted)


def checkpoint(uri: str) -> int | None:
    """Write a checkpoint of the table's current version; return that version."""
    table = open_table(uri)
    if table is None:
        return None
    table.create_checkpoint()
    return table.version()


def files_at(uri: str, version: int | None) -> set[str]:
    """Paths (as the log names them) of the table's files at ``version``."""
    if version is None or version < 0:
        return set()
    table = load_table(uri, version)
    return set(pa.table(table.get_add_actions(flatten=True))["path"].to_pylist())


def compact_bronze(bronze_uri: str, silver_uri: str, silver_app_id: str, target_bytes: int,
                   *, now_ms: int | None = None) -> CompactionResult:
    """Compact bronze among the files silver has applied (module docstring), in commit
    order; nothing before silver has applied anything."""
    applied = committed_version(open_table(silver_uri), silver_app_id)
    if applied is None or open_table(bronze_uri) is None:
        return CompactionResult()
    return compact(bronze_uri, BRONZE_ORDER, target_bytes, eligible=files_at(bronze_uri, applied),
                   repair_overlaps=False, data_change=False, now_ms=now_ms)


def last_compaction_ms(uri: str, limit: int = 200) -> int | None:
    """Commit time (epoch ms) of the table's latest compaction among its last ``limit``
    commits."""
    table = open_table(uri)
    if table is None:
        return None
    for entry in table.history(limit):
        if entry.get("pgcdc.kind") == "compaction":
            return int(entry["timestamp"])
    return None
