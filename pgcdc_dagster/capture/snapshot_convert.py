"""Snapshot rows (every column as text) to bronze ``op = r`` events and silver rows at once.

Each column is converted once, to its bronze (Debezium) encoding; its silver value is decoded
from that bronze value (``from_bronze``), which the converters guarantee equals
``to_silver`` of the text and is cheaper than converting the text a second time. Values
that every row of a snapshot shares (the ``source`` block, ``op``, the sequence) are built
as constants.

The Parquet files are laid out to be cheap to write; none of it changes what a reader sees,
since the Arrow schema is not embedded (``store_schema=False``) and Delta readers read the
files with the table's schema:

* A string constant (``source.version``, ``op`` ...) is an Arrow dictionary array (one
  value, all indices 0), which the writer stores as its dictionary page and index runs
  without hashing every value; so is the row markers' column (``source.snapshot``: "true"
  and the first/last markers, each value once in its dictionary, or the writer would fall
  back to PLAIN). The writer stores only binary-like dictionaries as they are, so integer
  constants (``ts_ms``, ``__commit_lsn``, ``source.lsn``, silver ``__lsn`` ...) are plain
  repeated values, written dictionary-encoded (a one-value dictionary page and index runs
  of width 0): the writer hashes each value, which costs less than DELTA_BINARY_PACKED's
  blocks (the ten integer constants of a bronze and a silver row: 13 ns per row
  less, measured on an 87,860-row row group of ``orders``; the files slightly smaller).
* A constant whose value is not NULL (every one but ``source.txId``/``source.xmin``), and
  the markers, are REQUIRED Parquet fields, so no definition levels are written for them
  (the ``source`` struct itself is required in the table schema already). NULL constants
  (``source.txId``, ``source.xmin``) stay optional.
* The bronze columns NULL in every snapshot row (``before``, ``transaction``,
  ``__toast_unchanged``) are not in the file at all: every reader takes a column a file
  lacks as null, as it does for a column added after the file was written (Delta readers
  read with the table's schema; so do this project's: ``lake/bronze_read.py``,
  ``lake/data_files.read_file`` for compaction, Spark's ``spark/silver_batch.read_bronze``
  given the table's schema). Their eleven leaves, definition levels only, cost about 40 ns
  per row to write (an 87,860-row row group of ``orders``: 175-180 against
  215-220 ns per row of bronze).
* Data columns with few distinct values in the first row group are dictionary-encoded.
  A first row group of fewer than ``PLAN_MIN_ROWS`` rows (a small table's) is not planned:
  no dictionary, every integer column DELTA_BINARY_PACKED.
* Every other integer-physical column (Parquet INT32/INT64: integers, dates, times,
  timestamps; e.g. ``key.id``, ``after.id``, silver ``id``) is written DELTA_BINARY_PACKED:
  sequential keys and timestamps pack to almost nothing, random values to about their bit
  width, both cheaper than PLAIN + zstd. Where the first row group's values span (nearly)
  the whole physical width (random 64-bit ids, hashes), delta packing gains nothing and
  costs more than PLAIN, so such a column stays PLAIN + zstd.
* The DELTA_BINARY_PACKED columns, the constants and the NULL constants are
  uncompressed: they would shrink by a few kB per file at most, and zstd costs about
  0.5 ms per column and file even then. The other columns (data, the boolean constant
  ``__deleted``) are zstd level 1.
* Decimals of up to 18 digits (silver NUMERIC(p,s), precise mode) are stored as INT64 (as
  Spark writes them), so they are integer-physical columns too; wider ones as fixed-size
  binary.
* Statistics are written for the flat columns Delta file stats carry (`lake/file_stats.py`:
  integers, bool, floats, strings, dates, timestamps, decimals).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.envelope import (
    CONNECTOR_VERSION,
    SourceIdentity,
    relaxed,
    sequence_text,
)
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.lake.parquet_layout import LOW_CARDINALITY, PLAN_MIN_ROWS, SAMPLE_ROWS
from pgcdc_dagster.lake.parquet_layout import FileLayout as _FileLayout
from pgcdc_dagster.lake.parquet_layout import flat_stats as _flat_stats

SNAPSHOT_MARKERS = ("true", "first", "first_in_data_collection", "last_in_data_collection",
                    "last", "incremental")
"""Values of ``source.snapshot`` (Debezium 2.x enum; SNAP-31)."""



INDEX = pa.int32()


def _dictionary(values: pa.Array, indices: np.ndarray) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices, INDEX), values)


def _dictionary_type(typ: pa.DataType) -> bool:
    """Whether a constant of this type is written as a dictionary array: the Parquet writer
    stores only binary-like dictionaries as they are (others it decodes and hashes value
    by value, slower than DELTA_BINARY_PACKED for integers; booleans have no dictionary)."""
    return bool(pa.types.is_string(typ) or pa.types.is_large_string(typ)
                or pa.types.is_binary(typ) or pa.types.is_large_binary(typ))


class _Constants:
    """Constant columns, built once per converter and sliced (zero-copy) per row group:
    one-value dictionary arrays (binary-like types) or repeated values; all-null columns as
    null arrays."""

    def __init__(self) -> None:
        self._length = 0
        self._cache: dict[tuple[Any, pa.DataType], pa.Array] = {}

    def __call__(self, value: Any, n: int, typ: pa.DataType) -> pa.Array:
        if value is None:
            return pa.nulls(n, typ)
        if self._length < n:
            self._length = n
            self._cache.clear()
        key = (value, typ)
        array = self._cache.get(key)
        if array is None:
            if _dictionary_type(typ):
                zeros = np.zeros(self._length, dtype=np.int32)
                array = _dictionary(pa.array([value], typ), zeros)
            else:
                array = pa.repeat(pa.scalar(value, typ), self._length)
            self._cache[key] = array
        return array if len(array) == n else array.slice(0, n)


def _writer_field(field: pa.Field, constant: set[str], prefix: str = "") -> pa.Field:
    """The field with the constant leaves (dotted paths) required, and typed as dictionaries
    where :func:`_dictionary_type` says so."""
    path = f"{prefix}{field.name}"
    if pa.types.is_struct(field.type):
        children = [_writer_field(field.type.field(i), constant, path + ".")
                    for i in range(field.type.num_fields)]
        return field.with_type(pa.struct(children))
    if path not in constant:
        return field
    field = field.with_nullable(False)
    if _dictionary_type(field.type):
        return field.with_type(pa.dictionary(INDEX, field.type))
    return field


def writer_schema(schema: pa.Schema, constant: Sequence[str],
                  absent: Sequence[str] = ()) -> pa.Schema:
    """The Arrow schema a Parquet writer receives: the ``constant`` leaves (every row holds
    the same value, never NULL) non-nullable, the binary-like ones as dictionaries; the
    ``absent`` top-level columns (NULL in every row) left out."""
    paths, left_out = set(constant), set(absent)
    return pa.schema([_writer_field(f, paths) for f in schema if f.name not in left_out],
                     metadata=schema.metadata)


def _dictionary_leaves(field: pa.Field, prefix: str = "") -> list[str]:
    """Paths of the dictionary-typed leaves (string constants, the row markers) under a
    writer schema's field."""
    path = f"{prefix}{field.name}"
    if pa.types.is_struct(field.type):
        out: list[str] = []
        for i in range(field.type.num_fields):
            out.extend(_dictionary_leaves(field.type.field(i), path + "."))
        return out
    return [path] if pa.types.is_dictionary(field.type) else []


class ChunkConverter:
    """Converts text batches of one table to bronze and silver tables (one per row group)."""

    def __init__(self, relation: Relation, converters: Sequence[ColumnConverter],
                 ident: SourceIdentity, *, bronze_schema: pa.Schema, silver_schema: pa.Schema,
                 lsn: int, processed_ms: int) -> None:
        self.relation = relation
        self.converters = tuple(converters)
        self.ident = ident
        self.lsn = lsn
        self.processed_ms = processed_ms
        self.bronze_schema = bronze_schema
        self.silver_schema = silver_schema
        data = {c.silver_field.name for c in converters}
        self._silver_meta = [f.name for f in silver_schema if f.name not in data]
        self._silver_data = [f.name for f in silver_schema if f.name in data]
        self._value_type = self.bronze_schema.field("after").type
        self._key_type = self.bronze_schema.field("key").type
        self._source_type = self.bronze_schema.field("source").type
        self._relaxed = [relaxed(c.bronze_field).type for c in converters]
        self._dictionary: list[str] | None = None
        self._const = _Constants()
        ms = processed_ms
        self._source_values: dict[str, Any] = {
            "version": CONNECTOR_VERSION, "connector": "postgresql", "name": ident.name,
            "ts_ms": ms, "db": ident.db, "sequence": sequence_text(None, lsn),
            "ts_us": ms * 1000, "schema": relation.namespace, "table": relation.name,
            "txId": None, "lsn": lsn, "xmin": None,
        }
        """The ``source`` block of every row (``snapshot`` is the row markers, never NULL)."""
        self._bronze_values: dict[str, Any] = {
            "op": "r", "ts_ms": ms, "__commit_lsn": lsn, "__ordinal": 0}
        self._silver_values: dict[str, Any] = {
            "__op": "r", "__lsn": lsn, "__commit_lsn": lsn, "__ordinal": 0,
            "__source_ts_ms": ms, "__deleted": False}
        self.bronze_writer_schema = writer_schema(bronze_schema, self._bronze_constant(),
                                                  self._bronze_absent())
        """The bronze file's Arrow schema (constant columns required, the string ones as
        dictionaries, the all-NULL top-level columns left out)."""
        self.silver_writer_schema = writer_schema(silver_schema, self._silver_constant())
        self._w_source = self.bronze_writer_schema.field("source").type
        self._markers_type = self._w_source.field("snapshot").type
        self._bronze_layout = _FileLayout(self.bronze_writer_schema)
        self._silver_layout = _FileLayout(self.silver_writer_schema)

    def _bronze_constant(self) -> list[str]:
        """Leaves with one non-NULL value in every row: the ``source`` block (the markers
        included) but its NULL fields, and the top-level constants."""
        source = [f"source.{f.name}" for f in self._source_type
                  if f.name == "snapshot" or self._source_values.get(f.name) is not None]
        return source + [name for name, value in self._bronze_values.items()
                         if value is not None and name in self.bronze_schema.names]

    def _bronze_absent(self) -> list[str]:
        """Top-level columns NULL in every snapshot row (``before``, ``transaction``,
        ``__toast_unchanged``): not written (module docstring)."""
        return [f.name for f in self.bronze_schema if f.name not in ("key", "after", "source")
                and self._bronze_values.get(f.name) is None]

    def _silver_constant(self) -> list[str]:
        return [name for name in self._silver_meta
                if self._silver_values.get(name) is not None]

    # Parquet options -------------------------------------------------------------------

    @property
    def bronze_options(self) -> dict[str, Any]:
        """ParquetWriter options of the bronze file (ask after the first row group is
        assembled: the integer encodings are planned from it)."""
        constant = [p for f in self.bronze_writer_schema for p in _dictionary_leaves(f)]
        constant += self._bronze_layout.integers(self._bronze_constant())
        nulls = [f"source.{f.name}" for f in self._source_type
                  if f.name != "snapshot" and self._source_values.get(f.name) is None]
        return self._bronze_layout.options(constant + self._low_cardinality("after."),
                                           _flat_stats(self.bronze_schema), constant + nulls)

    @property
    def silver_options(self) -> dict[str, Any]:
        """ParquetWriter options of the silver file (see :attr:`bronze_options`)."""
        constant = [p for f in self.silver_writer_schema for p in _dictionary_leaves(f)]
        constant += self._silver_layout.integers(self._silver_constant())
        nulls = [name for name in self._silver_meta if self._silver_values.get(name) is None]
        return self._silver_layout.options(constant + self._low_cardinality(""),
                                           _flat_stats(self.silver_schema), constant + nulls)

    def _low_cardinality(self, prefix: str) -> list[str]:
        return [prefix + name for name in (self._dictionary or [])]

    def plan_dictionary(self, columns: Sequence[pa.Array | pa.ChunkedArray]) -> None:
        """Choose the dictionary-encoded data columns from the first row group's values
        (text or converted, one per converter: distinct counts are the same)."""
        if self._dictionary is not None:
            return
        self._dictionary = []
        if len(columns) and len(columns[0]) < PLAN_MIN_ROWS:
            return  # a small table's file: not worth planning (parquet_layout)
        for conv, col in zip(self.converters, columns, strict=True):
            sample = col.slice(0, min(len(col), SAMPLE_ROWS))
            limit = max(1, int(max(len(sample), 1) * LOW_CARDINALITY))
            try:
                distinct = pc.count_distinct(sample, mode="all").as_py()
            except pa.ArrowNotImplementedError:  # nested values: no dictionary
                continue
            if distinct <= limit:
                self._dictionary.append(conv.bronze_field.name)

    # Conversion ------------------------------------------------------------------------

    def assemble(self, pairs: Sequence[tuple[pa.Array, pa.Array]], n: int, *,
                 first_marker: str | None = None,
                 last_marker: str | None = None) -> tuple[pa.Table, pa.Table]:
        """Bronze and silver tables from each column's converted ``(bronze, silver)``."""
        bronze_cols: list[pa.Array] = []
        silver_cols: list[pa.Array] = []
        for i, (b, s) in enumerate(pairs):
            if b.type != self._relaxed[i]:
                b = b.cast(self._relaxed[i])
            bronze_cols.append(b)
            silver_cols.append(s)
        after = pa.StructArray.from_arrays(bronze_cols, fields=list(self._value_type))
        key_names = [f.name for f in self._key_type]
        by_name = dict(zip([c.bronze_field.name for c in self.converters], bronze_cols,
                           strict=True))
        key = pa.StructArray.from_arrays([by_name[k] for k in key_names],
                                         fields=list(self._key_type))
        const = self._const
        marker = _markers(n, first_marker, last_marker, self._markers_type)
        source = pa.StructArray.from_arrays(
            [marker if f.name == "snapshot" else const(self._source_values.get(f.name), n, f.type)
             for f in self._source_type], fields=list(self._w_source))
        bronze_values: dict[str, pa.Array] = {"key": key, "after": after, "source": source}
        for name, value in self._bronze_values.items():
            if name in self.bronze_schema.names:
                bronze_values[name] = const(value, n, self.bronze_schema.field(name).type)
        bronze = pa.Table.from_arrays(
            [_typed(bronze_values.get(f.name), f, n) for f in self.bronze_writer_schema],
            schema=self.bronze_writer_schema)
        silver_values: dict[str, pa.Array] = {
            name: const(self._silver_values.get(name), n, self.silver_schema.field(name).type)
            for name in self._silver_meta}
        silver_values.update(zip([c.silver_field.name for c in self.converters], silver_cols,
                                 strict=True))
        silver = pa.Table.from_arrays(
            [_typed(silver_values.get(f.name), f, n) for f in self.silver_writer_schema],
            schema=self.silver_writer_schema)
        self._bronze_layout.plan(bronze, ("key", "after"))  # the rest are constants
        self._silver_layout.plan(silver, self._silver_data)
        return bronze, silver


def _typed(values: pa.Array | None, field: pa.Field, n: int) -> pa.Array:
    if values is None:
        return pa.nulls(n, field.type)
    return values if values.type == field.type else values.cast(field.type)


def _markers(n: int, first: str | None, last: str | None, typ: pa.DataType) -> pa.Array:
    """``source.snapshot``: "true", with the first/last row markers where given (a single
    row that is both first and last is marked last).

    The dictionary holds each value once: the Parquet writer stores a dictionary with
    repeated values by decoding it and writing every value PLAIN (several times slower)."""
    indices = np.zeros(n, dtype=np.int32)
    values = ["true"]
    for row, marker in ((0, first), (n - 1, last)):
        if marker is not None and n:
            if marker not in values:
                values.append(marker)
            indices[row] = values.index(marker)
    return _dictionary(pa.array(values, typ.value_type), indices)
