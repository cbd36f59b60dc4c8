"""The Parquet layout of silver and bronze data files (snapshot, merge and compaction output).

Chosen to be cheap to write and small (``capture/snapshot_convert.py`` explains each choice):
integer-physical columns DELTA_BINARY_PACKED and uncompressed unless their values span
(nearly) their whole width, low-cardinality columns dictionary-encoded, everything else zstd
level 1, statistics only for the flat columns Delta file statistics carry, no
embedded Arrow schema (Delta readers read the files with the table's schema).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pgcdc_dagster.lake.file_stats import stats_columns

COMPRESSION = "zstd"
COMPRESSION_LEVEL = 1
LOW_CARDINALITY = 0.05
"""Dictionary-encode a data column when its first row group has fewer distinct values than
this fraction of its rows."""
INTEGER_ENCODING = "DELTA_BINARY_PACKED"
"""Encoding of the integer-physical columns written without dictionary (uncompressed)."""
INTEGER_BITS = {"INT32": 32, "INT64": 64}
"""Parquet physical types DELTA_BINARY_PACKED applies to, and their widths."""
WIDE_MARGIN_BITS = 4
"""An integer column whose first row group's values span at least its physical width less
this many bits (2^28 for INT32, 2^60 for INT64) stays PLAIN + zstd. Measured on 514k
uniformly random values, DELTA_BINARY_PACKED (uncompressed) against PLAIN + zstd: faster
or within 16 % and 3-15 % smaller below those spans, but 1.4-1.65x slower at (nearly) full
width, for no smaller file. Sequential or clustered values gain far more (4x faster)."""
SAMPLE_ROWS = 20_000
"""Rows of the first row group the column plans (dictionary, integer encoding) look at."""


def parquet_columns(schema: pa.Schema) -> list[tuple[str, str]]:
    """``(path, physical type)`` of each leaf column of a Parquet file written with
    ``schema``, the path as the writer's per-column options name it (``key.id``,
    ``after.tags.list.element``)."""
    sink = pa.BufferOutputStream()
    pq.ParquetWriter(sink, schema, store_schema=False, store_decimal_as_integer=True).close()
    parquet = pq.read_metadata(pa.BufferReader(sink.getvalue())).schema
    return [(parquet.column(i).path, parquet.column(i).physical_type)
            for i in range(len(parquet))]


def leaf_arrays(path: str, values: pa.Array) -> Iterator[tuple[str, pa.Array]]:
    """``(Parquet path, values)`` of each leaf column under ``values`` (list elements
    flattened), named like :func:`parquet_columns`."""
    typ = values.type
    if pa.types.is_struct(typ):
        for i in range(typ.num_fields):
            yield from leaf_arrays(f"{path}.{typ.field(i).name}", values.field(i))
    elif pa.types.is_map(typ):
        yield from leaf_arrays(f"{path}.key_value.key", values.keys)
        yield from leaf_arrays(f"{path}.key_value.value", values.items)
    elif pa.types.is_list(typ) or pa.types.is_large_list(typ) or \
            pa.types.is_fixed_size_list(typ):
        yield from leaf_arrays(f"{path}.list.element", values.flatten())
    else:
        yield path, values


def wide(values: pa.Array, bits: int) -> bool:
    """Whether integer-physical ``values`` span at least ``bits - WIDE_MARGIN_BITS`` bits
    (nothing for delta packing to gain); False when that cannot be told (no values)."""
    typ = values.type
    try:
        if pa.types.is_dictionary(typ):
            return False
        if not pa.types.is_integer(typ):  # dates, times, timestamps: their stored integers
            values = values.view(pa.int32() if typ.bit_width == 32 else pa.int64())
        bounds = pc.min_max(values)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError):
        return False
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None or high is None:
        return False
    return int(high - low).bit_length() >= bits - WIDE_MARGIN_BITS


class FileLayout:
    """The Parquet leaf columns of one kind of snapshot file (bronze or silver) and the
    integer columns that stay PLAIN (planned from the first row group written)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.plain: set[str] | None = None

    @cached_property
    def columns(self) -> list[tuple[str, str]]:
        return parquet_columns(self.schema)

    def plan(self, table: pa.Table) -> None:
        """Find the integer columns whose values are too wide for delta packing."""
        if self.plain is not None or table.num_rows == 0:
            return
        widths = {path: INTEGER_BITS[t] for path, t in self.columns if t in INTEGER_BITS}
        sample = table.slice(0, SAMPLE_ROWS)
        self.plain = {
            path for name in sample.column_names
            for path, values in leaf_arrays(name, sample.column(name).combine_chunks())
            if path in widths and wide(values, widths[path])}

    def options(self, dictionary: list[str], statistics: list[str],
                uncompressed: Sequence[str]) -> dict[str, Any]:
        """ParquetWriter options: ``dictionary`` columns dictionary-encoded, the other
        integer columns DELTA_BINARY_PACKED (but the wide ones), and zstd for all columns
        but the DELTA_BINARY_PACKED ones and those under ``uncompressed`` (dotted paths:
        string constants, all-null columns)."""
        keep = set(dictionary) | (self.plain or set())
        delta = {path for path, t in self.columns if t in INTEGER_BITS and path not in keep}
        plain, prefixes = set(uncompressed), tuple(f"{name}." for name in uncompressed)
        compression = {
            path: "none" if path in delta or path in plain or path.startswith(prefixes)
            else COMPRESSION for path, _ in self.columns}
        return {"compression": compression,
                "compression_level": {path: COMPRESSION_LEVEL
                                      for path, codec in compression.items() if codec != "none"},
                "use_dictionary": dictionary,
                "column_encoding": {path: INTEGER_ENCODING for path in sorted(delta)} or None,
                "write_statistics": statistics, "store_schema": False,
                "store_decimal_as_integer": True}


def flat_stats(schema: pa.Schema) -> list[str]:
    """Top-level columns written with statistics: those Delta file stats carry
    (``lake/file_stats.py``)."""
    return stats_columns(schema)
