"""A silver batch applied by rewriting only the data files that hold changed keys.

delta-rs's MERGE (1.6.6) prunes the files it scans by the batch's min/max key only, and
writes every scanned file back as one output file whose rows are in no key order: a batch
of keys spread over the table rewrites all of it, and the output no longer prunes.
Here, instead (copy-on-write at file granularity, as Delta's MERGE without deletion
vectors; docs/operations.md explains why not deletion vectors):

1. the candidate files are those whose key ranges (Delta min/max statistics of each key
   column: integers, strings and uuids, dates, timestamps, decimals) can hold one of the
   batch's keys (``lake/key_ranges.py``; a file is kept when that cannot be told);
2. of each candidate, only the key and sequence columns are read and joined with the batch
   (NULL keys equal each other, as ``IS NOT DISTINCT FROM``);
3. a file is rewritten only when a batch row is newer than one of its rows (greatest
   sequence ``(__commit_lsn, __ordinal)`` wins): its rows, the newer ones replaced (the
   stored value kept for columns in ``__toast_unchanged``), sorted by key, in the snapshot's
   layout;
4. batch rows whose key no file holds are inserted as new files, sorted by key;
5. one commit removes the rewritten files and adds the new ones, with the batch's app
   transaction. A concurrent commit that removed one of those files (upkeep's compaction)
   makes it fail with a conflict (delta-rs checks removed files against the read version);
   :func:`pgcdc_dagster.lake.silver.merge_batch` then runs the batch again from step 1.

Memory: the batch, plus one candidate file at a time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from pgcdc_dagster.lake.commit_safety import ensure_safe_commits
from pgcdc_dagster.lake.data_files import (
    StoredFile,
    bytes_per_row,
    delete_files,
    key_candidates,
    read_file,
    rows_per_file,
    sort_by_keys,
    stored_files,
    write_clustered,
)
from pgcdc_dagster.lake.delta import DataFile, commit_properties

SEQ = ("__commit_lsn", "__ordinal")
UNCHANGED = "__toast_unchanged"


@dataclass
class RewriteResult:
    """What one batch did to the table's files and rows."""

    inserted: int = 0
    updated: int = 0
    files_read: int = 0
    files_removed: int = 0
    bytes_removed: int = 0
    added: list[DataFile] = field(default_factory=list)

    @property
    def bytes_added(self) -> int:
        return sum(f.size for f in self.added)


def apply_rewrite(table: DeltaTable, uri: str, source: pa.Table, *, keys: Sequence[str],
                  toastable: Sequence[str], app_id: str, version: int,
                  metadata: dict[str, str] | None, target_file_bytes: int) -> RewriteResult:
    """Apply ``source`` (one row per key, silver columns plus ``__toast_unchanged``) and
    commit (module docstring). ``table`` is at the version the rewrite is based on."""
    stored = pa.schema(table.schema().to_arrow())
    files = stored_files(table, keys)
    per_file = rows_per_file(target_file_bytes, bytes_per_row(files))
    rows = _conform(source, stored)
    unchanged = source[UNCHANGED].combine_chunks() if UNCHANGED in source.column_names \
        else pa.nulls(source.num_rows, pa.list_(pa.string()))
    toast = [c for c in toastable if c in rows.column_names]
    result = RewriteResult()
    matched = np.zeros(rows.num_rows, dtype=bool)
    removed: list[StoredFile] = []
    for f in key_candidates(files, rows, keys, stored):
        probe = read_file(uri, f.path, stored, [*keys, *SEQ])
        result.files_read += 1
        t_idx, s_idx = match_keys(probe, rows, keys)
        if len(s_idx) == 0:
            continue
        matched[s_idx] = True
        newer = _newer(rows, s_idx, probe, t_idx)
        if not newer.any():
            continue  # replays and late arrivals: nothing to change in this file
        t_new, s_new = t_idx[newer], s_idx[newer]
        target = read_file(uri, f.path, stored)
        keep = np.ones(target.num_rows, dtype=bool)
        keep[t_new] = False
        updated = _updated_rows(target.take(t_new), rows.take(s_new),
                                unchanged.take(pa.array(s_new)), toast, stored)
        out = pa.concat_tables([target.filter(pa.array(keep)), updated])
        result.added += write_clustered(uri, out, keys, per_file, "part-silver")
        result.updated += len(t_new)
        removed.append(f)
    inserts = rows.filter(pa.array(~matched))
    if inserts.num_rows:
        result.added += write_clustered(uri, _filled(sort_by_keys(inserts, keys), stored),
                                        keys, per_file, "part-silver")
        result.inserted = inserts.num_rows
    result.files_removed = len(removed)
    result.bytes_removed = sum(f.size for f in removed)
    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [
        RemoveAction(f.path, True, now, f.size, {}) for f in removed]
    actions += [AddAction(f.path, f.size, {}, now, True, f.stats) for f in result.added]
    ensure_safe_commits(table.table_uri)
    try:
        table.create_write_transaction(
            actions, "append", stored,
            commit_properties=commit_properties(app_id, version, metadata))
    except CommitFailedError:
        delete_files(uri, result.added)
        raise
    return result


def match_keys(target: pa.Table, source: pa.Table, keys: Sequence[str]
               ) -> tuple[np.ndarray, np.ndarray]:
    """Row indices ``(target, source)`` of the pairs with equal keys, NULL equal to NULL."""
    t_cols: dict[str, pa.Array | pa.ChunkedArray] = {}
    s_cols: dict[str, pa.Array | pa.ChunkedArray] = {}
    for i, k in enumerate(keys):
        a, b = target[k], source[k]
        if a.null_count or b.null_count:
            t_cols[f"__n{i}"] = pc.cast(pc.is_null(a), pa.int8())
            s_cols[f"__n{i}"] = pc.cast(pc.is_null(b), pa.int8())
            values = pc.drop_null(pa.chunked_array([*_chunks(a), *_chunks(b)], a.type))
            if len(values) == 0:
                continue  # NULL on both sides: the flag is the whole key
            a, b = pc.fill_null(a, values[0]), pc.fill_null(b, values[0])
        t_cols[f"__k{i}"], s_cols[f"__k{i}"] = a, b
    names = list(t_cols)
    t_cols["__ti"] = pa.array(np.arange(target.num_rows, dtype=np.int64))
    s_cols["__si"] = pa.array(np.arange(source.num_rows, dtype=np.int64))
    joined = pa.table(t_cols).join(pa.table(s_cols), keys=names, join_type="inner",
                                   use_threads=False)
    return (np.asarray(joined["__ti"].combine_chunks(), dtype=np.int64),
            np.asarray(joined["__si"].combine_chunks(), dtype=np.int64))


def _chunks(values: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return values.chunks if isinstance(values, pa.ChunkedArray) else [values]


def _newer(source: pa.Table, s_idx: np.ndarray, target: pa.Table, t_idx: np.ndarray
           ) -> np.ndarray:
    """Whether each matched batch row's sequence is greater than the stored row's."""
    s_lsn, s_ord = (np.asarray(source[c].combine_chunks())[s_idx] for c in SEQ)
    t_lsn, t_ord = (np.asarray(target[c].combine_chunks())[t_idx] for c in SEQ)
    return (s_lsn > t_lsn) | ((s_lsn == t_lsn) & (s_ord > t_ord))  # type: ignore[no-any-return]


def _conform(source: pa.Table, stored: pa.Schema) -> pa.Table:
    """The batch's silver columns in the stored types (the schema was evolved before)."""
    cols = [n for n in stored.names if n in source.column_names]
    return pa.table({n: source[n].cast(stored.field(n).type) for n in cols})


def _filled(rows: pa.Table, stored: pa.Schema) -> pa.Table:
    """Inserted rows with every stored column (a column the batch lacks is NULL)."""
    return pa.Table.from_arrays(
        [rows[f.name] if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
         for f in stored], schema=stored)


def _updated_rows(old: pa.Table, new: pa.Table, unchanged: pa.Array, toastable: Sequence[str],
                  stored: pa.Schema) -> pa.Table:
    """The batch's rows replacing stored ones: a column the batch lacks keeps the stored
    value, and so does a TOAST column its event left unchanged."""
    flags = {c: _lists_contain(unchanged, c) for c in toastable}
    columns = []
    for f in stored:
        if f.name not in new.column_names:
            columns.append(old[f.name])
        elif f.name in flags and flags[f.name].any():
            columns.append(pc.if_else(pa.array(flags[f.name]), old[f.name], new[f.name]))
        else:
            columns.append(new[f.name])
    return pa.Table.from_arrays(columns, schema=stored)


def _lists_contain(lists: pa.Array, name: str) -> np.ndarray:
    """Per row: whether the list of column names holds ``name``."""
    out = np.zeros(len(lists), dtype=bool)
    if len(lists) == 0 or lists.null_count == len(lists):
        return out
    flat = pc.list_flatten(lists)
    parents = np.asarray(pc.list_parent_indices(lists))
    hits = np.asarray(pc.fill_null(pc.equal(flat, name), False), dtype=bool)
    out[parents[hits]] = True
    return out
