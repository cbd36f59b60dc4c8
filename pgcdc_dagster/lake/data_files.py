"""Data files of a Delta table as the rewrites see them, and clustered writing of new ones.

Silver's data files are clustered by key (sorted, each file a narrow key range) and bounded
in size (``target_file_bytes``), so that a change to a few keys touches only the files whose
key ranges hold them (``lake/silver_rewrite.py``), and compaction (``lake/upkeep.py``) keeps
them so. Every file is written with the snapshot's Parquet layout (``lake/parquet_layout.py``)
and carries Delta min/max statistics (``lake/file_stats.py``) for the flat integer, boolean,
string, date, timestamp and decimal columns, the keys among them (``lake/key_ranges.py``
prunes on them).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from deltalake import DeltaTable

from pgcdc_dagster.lake.delta import DataFile, stats_json
from pgcdc_dagster.lake.disk_full import explaining_full_disk
from pgcdc_dagster.lake.key_ranges import Range, candidates, file_ranges
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
    """A data file of the table's current version, with its key columns' ranges."""

    path: str
    """As the log names it (relative to the table root)."""
    size: int
    rows: int
    low: Any
    high: Any
    """Min/max of the first key column as the log has them (None without statistics)."""
    ranges: tuple[Range, ...] = ()
    """Per key column, its range in comparable form (``lake/key_ranges.py``)."""


def stored_files(table: DeltaTable, keys: str | Sequence[str] | None) -> list[StoredFile]:
    """The table's data files, with the key columns' min/max statistics the log has."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    names = [keys] if isinstance(keys, str) else list(keys or ())
    schema = pa.schema(table.schema().to_arrow())
    paths = actions["path"].to_pylist()
    sizes = actions["size_bytes"].to_pylist()
    rows = actions["num_records"].to_pylist() if "num_records" in actions.column_names \
        else [None] * len(paths)
    low = high = [None] * len(paths)
    per_key: list[list[Range]] = []
    for i, name in enumerate(names):
        lows, highs = (actions[f"{side}.{name}"].combine_chunks()
                       if f"{side}.{name}" in actions.column_names else None
                       for side in ("min", "max"))
        if i == 0 and lows is not None and highs is not None:
            low, high = lows.to_pylist(), highs.to_pylist()
        typ = schema.field(name).type if name in schema.names else pa.null()
        per_key.append(file_ranges(lows, highs, typ) if lows is not None and highs is not None
                       else [(None, None)] * len(paths))
    return [StoredFile(p, int(s), int(n) if n is not None else -1, lo, hi,
                       tuple(r[i] for r in per_key))
            for i, (p, s, n, lo, hi) in enumerate(zip(paths, sizes, rows, low, high,
                                                      strict=True))]


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
    with explaining_full_disk(path):
        pq.write_table(data, path, filesystem=fs, metadata_collector=collector,
                       row_group_size=max(data.num_rows, 1), **layout_options(data))
    size = fs.get_file_info(path).size
    return DataFile(name, int(size or 0), data.num_rows,
                    stats_json(collector[0], data.num_rows, data))


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


def key_candidates(files: Sequence[StoredFile], batch: pa.Table, keys: Sequence[str],
                   schema: pa.Schema) -> list[StoredFile]:
    """The files that can hold one of ``batch``'s keys (``lake/key_ranges.py``); ``files``
    from :func:`stored_files` with the same ``keys``, ``schema`` the stored one."""
    live = [f for f in files if f.rows != 0]
    keep = candidates([f.ranges for f in live], [batch[k] for k in keys],
                      [schema.field(k).type for k in keys])
    return [f for f, k in zip(live, keep, strict=True) if k]
