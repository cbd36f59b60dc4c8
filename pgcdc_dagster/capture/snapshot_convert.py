"""Snapshot rows (every column as text) to bronze ``op = r`` events and silver rows at once.

Each column is converted once, to its bronze (Debezium) encoding; its silver value is decoded
from that bronze value (``from_bronze``), which the converters guarantee equals
``to_silver`` of the text and is cheaper than converting the text a second time. Values
that every row of a snapshot shares (the ``source`` block, ``op``, the sequence) are built
as constants, and the Parquet files are written with dictionary encoding only where it pays
(constant and low-cardinality columns) and statistics only where Delta uses them.

A constant column is an Arrow dictionary array (one value, all indices 0), which the Parquet
writer stores as its dictionary page and index runs without hashing every value; the file's
Parquet schema is the plain one (the Arrow schema is not embedded, so no reader sees a
dictionary type), and Delta reads the files with the table's schema as usual.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.envelope import CONNECTOR_VERSION, SourceIdentity, relaxed
from pgcdc_dagster.cdc.typeconv import ColumnConverter

SNAPSHOT_MARKERS = ("true", "first", "first_in_data_collection", "last_in_data_collection",
                    "last", "incremental")
"""Values of ``source.snapshot`` (Debezium 2.x enum; SNAP-31)."""

COMPRESSION = "zstd"
COMPRESSION_LEVEL = 1
LOW_CARDINALITY = 0.05
"""Dictionary-encode a data column when its first row group has fewer distinct values than
this fraction of its rows."""


INDEX = pa.int32()


def _dictionary(values: pa.Array, indices: np.ndarray) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices, INDEX), values)


def _dictionary_type(typ: pa.DataType) -> bool:
    """Parquet has no dictionary encoding for booleans."""
    return not pa.types.is_boolean(typ)


class _Constants:
    """Constant columns as one-value dictionary arrays, built once per converter and sliced
    (zero-copy) per row group; all-null columns as null arrays."""

    def __init__(self) -> None:
        self._zeros = np.zeros(0, dtype=np.int32)
        self._cache: dict[tuple[Any, pa.DataType], pa.Array] = {}

    def __call__(self, value: Any, n: int, typ: pa.DataType) -> pa.Array:
        if value is None:
            return pa.nulls(n, typ)
        if not _dictionary_type(typ):
            return pa.repeat(pa.scalar(value, typ), n)
        if len(self._zeros) < n:
            self._zeros = np.zeros(n, dtype=np.int32)
            self._cache.clear()
        key = (value, typ)
        array = self._cache.get(key)
        if array is None:
            array = self._cache[key] = _dictionary(pa.array([value], typ), self._zeros)
        return array if len(array) == n else array.slice(0, n)


def _writer_field(field: pa.Field, constant: set[str], prefix: str = "") -> pa.Field:
    """The field with the constant leaves (dotted paths) typed as dictionaries."""
    path = f"{prefix}{field.name}"
    if pa.types.is_struct(field.type):
        children = [_writer_field(field.type.field(i), constant, path + ".")
                    for i in range(field.type.num_fields)]
        return field.with_type(pa.struct(children))
    if path in constant and _dictionary_type(field.type):
        return field.with_type(pa.dictionary(INDEX, field.type))
    return field


def writer_schema(schema: pa.Schema, constant: Sequence[str]) -> pa.Schema:
    """The Arrow schema a Parquet writer receives: ``constant`` leaves as dictionaries."""
    paths = set(constant)
    return pa.schema([_writer_field(f, paths) for f in schema], metadata=schema.metadata)


def _leaves(field: pa.Field, prefix: str = "") -> list[str]:
    path = f"{prefix}{field.name}"
    if pa.types.is_struct(field.type):
        out: list[str] = []
        for i in range(field.type.num_fields):
            out.extend(_leaves(field.type.field(i), path + "."))
        return out
    return [path]


def _flat_stats(schema: pa.Schema) -> list[str]:
    """Top-level int/bool columns: the only statistics Delta file stats carry here."""
    return [f.name for f in schema
            if pa.types.is_integer(f.type) or pa.types.is_boolean(f.type)]


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
        self._value_type = self.bronze_schema.field("after").type
        self._key_type = self.bronze_schema.field("key").type
        self._relaxed = [relaxed(c.bronze_field).type for c in converters]
        self._dictionary: list[str] | None = None
        self._const = _Constants()
        self.bronze_writer_schema = writer_schema(bronze_schema, self._bronze_constant())
        """The bronze file's Arrow schema (constant columns as dictionaries)."""
        self.silver_writer_schema = writer_schema(silver_schema, self._silver_constant())
        self._w_source = self.bronze_writer_schema.field("source").type
        self._markers_type = self._w_source.field("snapshot").type

    def _bronze_constant(self) -> list[str]:
        nulls = {"before", "transaction", "__toast_unchanged", "source.txId", "source.xmin"}
        return [p for f in self.bronze_schema if f.name not in ("key", "after", "before")
                for p in _leaves(f) if p not in nulls and p.split(".")[0] not in nulls]

    def _silver_constant(self) -> list[str]:
        made = {"__op", "__lsn", "__commit_lsn", "__ordinal", "__source_ts_ms", "__deleted"}
        return [name for name in self._silver_meta if name in made]

    # Parquet options -------------------------------------------------------------------

    def _options(self, schema: pa.Schema, dictionary: list[str]) -> dict[str, Any]:
        return {"compression": COMPRESSION, "compression_level": COMPRESSION_LEVEL,
                "use_dictionary": dictionary, "write_statistics": _flat_stats(schema),
                "store_schema": False}

    @property
    def bronze_options(self) -> dict[str, Any]:
        """ParquetWriter options of the bronze file."""
        constant = [p for f in self.bronze_schema if f.name not in ("key", "after", "before")
                    for p in _leaves(f)]
        return self._options(self.bronze_schema, constant + self._low_cardinality("after."))

    @property
    def silver_options(self) -> dict[str, Any]:
        """ParquetWriter options of the silver file."""
        return self._options(self.silver_schema, self._silver_meta + self._low_cardinality(""))

    def _low_cardinality(self, prefix: str) -> list[str]:
        return [prefix + name for name in (self._dictionary or [])]

    def plan_dictionary(self, columns: Sequence[pa.Array | pa.ChunkedArray]) -> None:
        """Choose the dictionary-encoded data columns from the first row group's values
        (text or converted, one per converter: distinct counts are the same)."""
        if self._dictionary is not None:
            return
        import pyarrow.compute as pc

        self._dictionary = []
        for conv, col in zip(self.converters, columns, strict=True):
            sample = col.slice(0, min(len(col), 20_000))
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
        ms, lsn, string, int64 = self.processed_ms, self.lsn, pa.string(), pa.int64()
        source = pa.StructArray.from_arrays([
            const(CONNECTOR_VERSION, n, string), const("postgresql", n, string),
            const(self.ident.name, n, string), const(ms, n, int64), marker,
            const(self.ident.db, n, string), const(json.dumps([None, str(lsn)]), n, string),
            const(ms * 1000, n, int64), const(self.relation.namespace, n, string),
            const(self.relation.name, n, string), pa.nulls(n, int64), const(lsn, n, int64),
            pa.nulls(n, int64),
        ], fields=list(self._w_source))
        bronze_values: dict[str, pa.Array] = {
            "key": key, "after": after, "source": source, "op": const("r", n, string),
            "ts_ms": const(ms, n, int64), "__commit_lsn": const(lsn, n, int64),
            "__ordinal": const(0, n, int64),
        }
        bronze = pa.Table.from_arrays(
            [_typed(bronze_values.get(f.name), f, n) for f in self.bronze_writer_schema],
            schema=self.bronze_writer_schema)
        silver_values: dict[str, pa.Array] = {
            "__op": const("r", n, string), "__lsn": const(lsn, n, int64),
            "__commit_lsn": const(lsn, n, int64), "__ordinal": const(0, n, int64),
            "__source_ts_ms": const(ms, n, int64), "__deleted": const(False, n, pa.bool_()),
        }
        silver_values.update(zip([c.silver_field.name for c in self.converters], silver_cols,
                                 strict=True))
        silver = pa.Table.from_arrays(
            [_typed(silver_values.get(f.name), f, n) for f in self.silver_writer_schema],
            schema=self.silver_writer_schema)
        return bronze, silver


def _typed(values: pa.Array | None, field: pa.Field, n: int) -> pa.Array:
    if values is None:
        return pa.nulls(n, field.type)
    return values if values.type == field.type else values.cast(field.type)


def _markers(n: int, first: str | None, last: str | None, typ: pa.DataType) -> pa.Array:
    """``source.snapshot``: "true", with the first/last row markers where given (a single
    row that is both first and last is marked last)."""
    indices = np.zeros(n, dtype=np.int32)
    if first is not None and n:
        indices[0] = 1
    if last is not None and n:
        indices[-1] = 2
    values = pa.array(["true", first or "true", last or "true"], typ.value_type)
    return _dictionary(values, indices)
