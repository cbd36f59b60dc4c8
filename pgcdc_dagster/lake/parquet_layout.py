"""The Parquet layout of silver and bronze data files (snapshot, merge and compaction output).

Chosen to be cheap to write and small (``capture/snapshot_convert.py`` explains each choice):
integer-physical columns DELTA_BINARY_PACKED and uncompressed unless their values span
(nearly) their whole width, low-cardinality columns dictionary-encoded, everything else zstd
level 1, statistics only for the flat columns Delta file statistics carry, no
embedded Arrow schema (Delta readers read the files with the table's schema). A small first
row group (:data:`PLAN_MIN_ROWS`) is not planned: every integer column is delta-packed.
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
PLAN_MIN_ROWS = 2048
"""A first row group of fewer rows is not planned (no dictionary for data columns, every
integer column delta-packed): for a small table's file the planning costs more than any
encoding choice could save (a thousand small tables)."""


def parquet_columns(schema: pa.Schema) -> list[tuple[str, str]]:
    """``(path, physical type)`` of each leaf column of a Parquet file written with
    ``schema`` (``store_decimal_as_integer``), the path as the writer's per-column options
    name it (``key.id``, ``after.tags.list.element``).

    Derived from the Arrow types as pyarrow's schema conversion maps them (no file written:
    a snapshot of many small tables plans two layouts per table); a type outside that
    mapping (extension types, ...) is learnt from the footer of an empty file written with
    the schema, as the writer itself converts it."""
    try:
        return [leaf for field in schema for leaf in _leaves(field.name, field.type)]
    except _Unmapped:
        return _written_columns(schema)


def _written_columns(schema: pa.Schema) -> list[tuple[str, str]]:
    """:func:`parquet_columns` from an empty file's footer."""
    sink = pa.BufferOutputStream()
    pq.ParquetWriter(sink, schema, store_schema=False, store_decimal_as_integer=True).close()
    parquet = pq.read_metadata(pa.BufferReader(sink.getvalue())).schema
    return [(parquet.column(i).path, parquet.column(i).physical_type)
            for i in range(len(parquet))]


class _Unmapped(Exception):
    """A type :func:`_physical` does not know."""


_INT32_TYPES = (pa.types.is_int8, pa.types.is_int16, pa.types.is_int32, pa.types.is_uint8,
                pa.types.is_uint16, pa.types.is_uint32, pa.types.is_date, pa.types.is_time32,
                pa.types.is_null)
_INT64_TYPES = (pa.types.is_int64, pa.types.is_uint64, pa.types.is_time64,
                pa.types.is_timestamp, pa.types.is_duration)
_BYTE_ARRAY_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                     pa.types.is_large_binary, pa.types.is_string_view,
                     pa.types.is_binary_view)
DECIMAL_INT32_DIGITS = 9
DECIMAL_INT64_DIGITS = 18
"""Decimals of up to this many digits are stored as INT32 / INT64
(``store_decimal_as_integer``), wider ones as FIXED_LEN_BYTE_ARRAY."""


def _physical(typ: pa.DataType) -> str:
    """The Parquet physical type pyarrow writes a flat Arrow type as."""
    if isinstance(typ, pa.BaseExtensionType):
        raise _Unmapped(str(typ))
    if pa.types.is_dictionary(typ):
        return _physical(typ.value_type)
    if pa.types.is_boolean(typ):
        return "BOOLEAN"
    if pa.types.is_float32(typ):
        return "FLOAT"
    if pa.types.is_float64(typ):
        return "DOUBLE"
    if pa.types.is_decimal(typ):
        return "INT32" if typ.precision <= DECIMAL_INT32_DIGITS else \
            "INT64" if typ.precision <= DECIMAL_INT64_DIGITS else "FIXED_LEN_BYTE_ARRAY"
    if any(test(typ) for test in _INT32_TYPES):
        return "INT32"
    if any(test(typ) for test in _INT64_TYPES):
        return "INT64"
    if any(test(typ) for test in _BYTE_ARRAY_TYPES):
        return "BYTE_ARRAY"
    if pa.types.is_fixed_size_binary(typ) or pa.types.is_float16(typ):
        return "FIXED_LEN_BYTE_ARRAY"
    raise _Unmapped(str(typ))


def _leaves(path: str, typ: pa.DataType) -> Iterator[tuple[str, str]]:
    """``(path, physical type)`` of the leaves under a field (named as the writer names
    them: list elements ``list.element``, map entries ``key_value.key``/``value``)."""
    if pa.types.is_struct(typ):
        if not typ.num_fields:
            raise _Unmapped("struct without fields")  # the writer's own error, please
        for i in range(typ.num_fields):
            yield from _leaves(f"{path}.{typ.field(i).name}", typ.field(i).type)
    elif pa.types.is_map(typ):
        yield from _leaves(f"{path}.key_value.key", typ.key_type)
        yield from _leaves(f"{path}.key_value.value", typ.item_type)
    elif pa.types.is_list(typ) or pa.types.is_large_list(typ) or \
            pa.types.is_fixed_size_list(typ) or pa.types.is_list_view(typ) or \
            pa.types.is_large_list_view(typ):
        yield from _leaves(f"{path}.list.element", typ.value_type)
    else:
        yield path, _physical(typ)


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

    def integers(self, paths: Sequence[str]) -> list[str]:
        """Those of the leaf ``paths`` whose Parquet physical type is an integer."""
        wanted = set(paths)
        return [path for path, t in self.columns if t in INTEGER_BITS and path in wanted]

    def plan(self, table: pa.Table, columns: Sequence[str] | None = None) -> None:
        """Find the integer columns whose values are too wide for delta packing, among the
        leaves under ``columns`` (default: all; the others, constants for instance, are
        taken as narrow). A first row group of fewer than :data:`PLAN_MIN_ROWS` rows is not
        looked at: every integer column is delta-packed (a small table's file, whose cost
        is the planning, not the encoding)."""
        if self.plain is not None or table.num_rows == 0:
            return
        if table.num_rows < PLAN_MIN_ROWS:
            self.plain = set()
            return
        widths = {path: INTEGER_BITS[t] for path, t in self.columns if t in INTEGER_BITS}
        sample = table.slice(0, SAMPLE_ROWS)
        names = sample.column_names if columns is None else columns
        self.plain = {
            path for name in names
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
