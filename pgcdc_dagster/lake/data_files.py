"""Data files of a Delta table as the rewrites see them, and clustered writing of new ones.

Silver's data files are clustered by key (sorted, each file a narrow key range) and bounded
in size (``target_file_bytes``), so that a change to a few keys touches only the files whose
key ranges hold them (``lake/silver_rewrite.py``), and compaction (``lake/upkeep.py``) keeps
them so. Every file is written with the snapshot's Parquet layout (``lake/parquet_layout.py``)
and carries Delta min/max statistics for the flat integer and boolean columns, the keys
among them.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from deltalake import DeltaTable

from pgcdc_dagster.lake.delta import DataFile, stats_json
from pgcdc_dagster.lake.parquet_layout import (
    LOW_CARDINALITY,
    SAMPLE_ROWS,
    FileLayout,
    flat_stats,
)
from pgcdc_dagster.lake.storage import filesystem

DEFAULT_TARGET_FILE_BYTES = 1 << 20
"""Target size of a silver data file (1 MiB). Copy-on-write rewrites whole files, so the
bytes a change to k random keys rewrites are about k files: the smaller the files, the
smaller the rewrite, the more files a reader opens (see docs/operations.md, "Silver file
layout and upkeep")."""
FALLBACK_BYTES_PER_ROW = 64
"""Bytes per row assumed for a table with no data file yet (only to size its first files)."""


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A data file of the table's current version, with its first key column's range."""

    path: str
    """As the log names it (relative to the table root)."""
    size: int
    rows: int
    low: Any
    high: Any
    """Min/max of the first key column (None when the file has no statistics for it)."""


def stored_files(table: DeltaTable, key: str | None) -> list[StoredFile]:
    """The table's data files, with ``key``'s min/max statistics when the log has them."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    paths = actions["path"].to_pylist()
    sizes = actions["size_bytes"].to_pylist()
    rows = actions["num_records"].to_pylist() if "num_records" in actions.column_names \
        else [None] * len(paths)
    low = high = [None] * len(paths)
    if key is not None and f"min.{key}" in actions.column_names \
            and f"max.{key}" in actions.column_names:
        low, high = actions[f"min.{key}"].to_pylist(), actions[f"max.{key}"].to_pylist()
    return [StoredFile(p, int(s), int(n) if n is not None else -1, lo, hi)
            for p, s, n, lo, hi in zip(paths, sizes, rows, low, high, strict=True)]


def bytes_per_row(files: Sequence[StoredFile]) -> float:
    """The table's average stored bytes per row (a fallback for a table without rows)."""
    rows = sum(f.rows for f in files if f.rows > 0)
    size = sum(f.size for f in files if f.rows > 0)
    return size / rows if rows else float(FALLBACK_BYTES_PER_ROW)


def rows_per_file(target_bytes: int, per_row: float) -> int:
    return max(1, int(target_bytes / max(per_row, 1.0)))


def read_file(uri: str, path: str, schema: pa.Schema,
              columns: Sequence[str] | None = None) -> pa.Table:
    """One data file read with the table's schema (columns added after it was written are
    null; the Arrow schema is not embedded in the files this project writes)."""
    fs, base = filesystem(uri)
    full = f"{base.rstrip('/')}/{unquote(path)}"
    dataset = pads.dataset(full, schema=schema, format="parquet", filesystem=fs)
    return dataset.to_table(columns=list(columns) if columns is not None else None)


def sort_by_keys(data: pa.Table, keys: Sequence[str]) -> pa.Table:
    return data.sort_by([(k, "ascending") for k in keys]) if data.num_rows > 1 else data


def write_clustered(uri: str, data: pa.Table, keys: Sequence[str], target_rows: int,
                    prefix: str) -> list[DataFile]:
    """Write ``data`` sorted by ``keys`` as files of about ``target_rows`` rows each (the
    last file takes a remainder below half the target), with the snapshot's layout."""
    if data.num_rows == 0:
        return []
    data = sort_by_keys(data, keys)
    n = data.num_rows
    count = max(1, round(n / max(target_rows, 1)))
    bounds = [n * i // count for i in range(count + 1)]
    return [write_data_file(uri, data.slice(a, b - a), prefix)
            for a, b in itertools.pairwise(bounds) if b > a]


def write_data_file(uri: str, data: pa.Table, prefix: str) -> DataFile:
    """One Parquet file under the table root with the layout of :func:`layout_options`."""
    name = f"{prefix}-{uuid.uuid4().hex}.parquet"
    fs, base = filesystem(uri)
    path = f"{base.rstrip('/')}/{name}"
    collector: list[pq.FileMetaData] = []
    pq.write_table(data, path, filesystem=fs, metadata_collector=collector,
                   row_group_size=max(data.num_rows, 1), **layout_options(data))
    size = fs.get_file_info(path).size
    return DataFile(name, int(size or 0), data.num_rows, stats_json(collector[0], data.num_rows))


def delete_files(uri: str, files: Sequence[DataFile]) -> None:
    """Delete files written under the table root that no commit will reference."""
    fs, base = filesystem(uri)
    for f in files:
        try:
            fs.delete_file(f"{base.rstrip('/')}/{f.path}")
        except OSError:
            pass  # an orphan: readers ignore it


def layout_options(data: pa.Table) -> dict[str, object]:
    """ParquetWriter options of the snapshot's layout, planned from ``data``'s first rows:
    low-cardinality columns dictionary-encoded, all-null columns uncompressed."""
    layout = FileLayout(data.schema)
    layout.plan(data)
    sample = data.slice(0, SAMPLE_ROWS)
    limit = max(1, int(max(sample.num_rows, 1) * LOW_CARDINALITY))
    dictionary: list[str] = []
    nulls: list[str] = []
    for name in sample.column_names:
        column = sample.column(name)
        if column.null_count == len(column):
            nulls.append(name)
            continue
        if pa.types.is_nested(column.type) or pa.types.is_boolean(column.type):
            continue
        try:
            distinct = pc.count_distinct(column, mode="all").as_py()
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            continue
        if distinct <= limit:
            dictionary.append(name)
    return layout.options(dictionary, flat_stats(data.schema), nulls)


def key_candidates(files: Sequence[StoredFile], values: pa.Array | pa.ChunkedArray
                   ) -> list[StoredFile]:
    """The files whose first-key range can hold one of ``values`` (the batch's first key
    column). Decided from the min/max statistics for integer keys without NULLs; anything
    else (other types, a NULL key, a file without statistics) keeps the file."""
    live = [f for f in files if f.rows != 0]
    if not pa.types.is_integer(values.type) or values.null_count or len(values) == 0:
        return live
    keys = np.unique(np.asarray(pc.cast(values, pa.int64())))
    out = []
    for f in live:
        if not isinstance(f.low, int) or not isinstance(f.high, int):
            out.append(f)
            continue
        i = int(np.searchsorted(keys, f.low))
        if i < len(keys) and keys[i] <= f.high:
            out.append(f)
    return out
