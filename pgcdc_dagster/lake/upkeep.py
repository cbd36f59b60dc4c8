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
* Whether silver's files are already clustered (disjoint key ranges) is decided on their
  exact first-key bounds: a string statistic cut to its first 32 characters
  (``lake/file_stats.py``) makes files whose keys share a longer prefix look overlapping, so
  the bounds of files that look overlapping with such cut statistics are read from the
  files' Parquet footers (which keep whole values) or, without footer statistics, from the
  key column itself. A second compaction of unchanged data then
  rewrites nothing.
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
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
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
from pgcdc_dagster.lake.file_stats import STRING_PREFIX
from pgcdc_dagster.lake.key_ranges import CUT_MARK
from pgcdc_dagster.lake.storage import filesystem

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


def key_components(files: Sequence[StoredFile], *, merge_overlaps: bool = True
                   ) -> list[list[StoredFile]]:
    """The files with first-key statistics in key order, those whose ranges overlap
    (transitively) together."""
    ranged = sorted((f for f in files if f.rows != 0 and f.low is not None
                     and f.high is not None), key=lambda f: (f.low, f.high))
    components: list[list[StoredFile]] = []
    high: Any = None
    for f in ranged:
        if merge_overlaps and components and f.low <= high:
            components[-1].append(f)
            high = max(high, f.high)
        else:
            components.append([f])
            high = f.high
    return components


def compaction_groups(files: Sequence[StoredFile], target_bytes: int, *,
                      repair_overlaps: bool,
                      max_group_bytes: int = MAX_GROUP_BYTES) -> list[list[StoredFile]]:
    """Groups of files to rewrite together, in key order (module docstring).

    Files without statistics for the first key are binned in log order after the others.
    """
    components = key_components(files, merge_overlaps=repair_overlaps)
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
    schema = pa.schema(table.schema().to_arrow())
    if repair_overlaps:  # exact bounds where cut statistics make files look overlapping
        suspects = {f.path for comp in key_components(files) if len(comp) > 1
                    and any(cut_bounds(f) for f in comp) for f in comp}
        files = [exact_bounds(uri, f, keys[0], schema) if f.path in suspects else f
                 for f in files]
    per_file = rows_per_file(target_bytes, bytes_per_row(files))
    for group in compaction_groups(files, target_bytes, repair_overlaps=repair_overlaps):
        data = pa.concat_tables([read_file(uri, f.path, schema) for f in group])
        # Rows per file from the group's own bytes per row: the table's average would split
        # a group of wider rows into files above the bound, split again at every run.
        per_group = rows_per_file(target_bytes, bytes_per_row(group)) \
            if all(f.rows > 0 for f in group) else per_file
        added = write_clustered(uri, data, keys, per_group, COMPACT_PREFIX)
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


def cut_bounds(f: StoredFile) -> bool:
    """Whether a file's first-key statistics may be cut strings (module docstring)."""
    return (isinstance(f.low, str) and len(f.low) >= STRING_PREFIX) or \
        (isinstance(f.high, str) and bool(f.high) and f.high[-1] >= CUT_MARK)


def exact_bounds(uri: str, f: StoredFile, key: str, schema: pa.Schema) -> StoredFile:
    """``f`` with the exact min/max of its first key column: from the Parquet footer, else
    from the column's values; ``f`` unchanged when neither can be read."""
    fs, base = filesystem(uri)
    try:
        with fs.open_input_file(f"{base.rstrip('/')}/{unquote(f.path)}") as handle:
            meta = pq.read_metadata(handle)
        lows, highs = [], []
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            stats = next((group.column(c).statistics for c in range(group.num_columns)
                          if group.column(c).path_in_schema == key), None)
            if stats is None or not stats.has_min_max:
                break
            lows.append(stats.min)
            highs.append(stats.max)
        else:
            if lows and all(isinstance(v, str) for v in lows + highs):
                return replace(f, low=min(lows), high=max(highs))
        bounds = pc.min_max(read_file(uri, f.path, schema, [key])[key])
    except (OSError, pa.ArrowException):
        return f
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    return f if low is None or high is None else replace(f, low=low, high=high)


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
