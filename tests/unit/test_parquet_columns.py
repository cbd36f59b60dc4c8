"""The Parquet leaf columns of a schema are derived from its Arrow types exactly as the
writer converts them (learning them by writing an empty file cost a small table's
snapshot two writers), and a small first row group is not planned."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pgcdc_dagster.lake import parquet_layout
from pgcdc_dagster.lake.parquet_layout import PLAN_MIN_ROWS, FileLayout, parquet_columns

pytestmark = pytest.mark.unit

FLAT = [
    pa.null(), pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(),
    pa.uint16(), pa.uint32(), pa.uint64(), pa.float16(), pa.float32(), pa.float64(),
    pa.date32(), pa.date64(), pa.time32("s"), pa.time32("ms"), pa.time64("us"),
    pa.time64("ns"), pa.timestamp("s"), pa.timestamp("us", tz="UTC"),
    pa.timestamp("ns", tz="UTC"), pa.duration("s"), pa.duration("us"),
    pa.decimal128(1, 0), pa.decimal128(9, 2), pa.decimal128(10, 2), pa.decimal128(18, 4),
    pa.decimal128(19, 2), pa.decimal128(38, 10), pa.decimal256(9, 0), pa.decimal256(18, 2),
    pa.decimal256(40, 2), pa.string(), pa.large_string(), pa.binary(), pa.large_binary(),
    pa.string_view(), pa.binary_view(), pa.binary(16),
    pa.dictionary(pa.int32(), pa.string()), pa.dictionary(pa.int8(), pa.int64()),
]
NESTED = [
    pa.list_(pa.int32()), pa.large_list(pa.string()), pa.list_(pa.int64(), 3),
    pa.list_view(pa.decimal128(12, 2)), pa.large_list_view(pa.date32()),
    pa.list_(pa.list_(pa.timestamp("us"))),
    pa.list_(pa.struct([("a", pa.int8()), ("b", pa.list_(pa.binary()))])),
    pa.map_(pa.string(), pa.int64()), pa.map_(pa.int16(), pa.list_(pa.decimal128(30, 3))),
    pa.struct([("x", pa.struct([("y", pa.large_list(pa.map_(pa.string(),
                                                               pa.decimal128(7, 1))))])),
               ("z", pa.dictionary(pa.int32(), pa.string()))]),
]


def test_leaf_columns_are_the_writers() -> None:
    """Every flat type at the top level and nested (struct, list, list view, fixed-size
    list, map, maps in lists in structs), decimals at each storage width: the same paths
    and physical types as the footer of a file the writer wrote with the schema."""
    fields = [pa.field(f"c{i}", t) for i, t in enumerate(FLAT + NESTED)]
    fields.append(pa.field("s", pa.struct([pa.field(f"f{i}", t) for i, t in enumerate(FLAT)])))
    fields.append(pa.field("required", pa.int64(), nullable=False))
    schema = pa.schema(fields)
    derived = parquet_columns(schema)
    assert derived == parquet_layout._written_columns(schema)
    assert len(derived) == 2 * len(FLAT) + 16  # every leaf, once
    assert [t for p, t in derived if p in ("s.f25", "s.f26", "s.f27", "s.f28")] == [
        "INT32", "INT64", "INT64", "FIXED_LEN_BYTE_ARRAY"]  # decimal(9|10|18|19)
    assert ("c48.list.element.b.list.element", "BYTE_ARRAY") in derived
    assert ("c50.key_value.value.list.element", "FIXED_LEN_BYTE_ARRAY") in derived


def test_types_outside_the_mapping_ask_the_writer() -> None:
    """An extension type (uuid) is not guessed: the writer's own conversion is used."""
    schema = pa.schema([("u", pa.uuid()), ("n", pa.int32())])
    assert parquet_columns(schema) == [("u", "FIXED_LEN_BYTE_ARRAY"), ("n", "INT32")]
    with pytest.raises(pa.ArrowNotImplementedError):  # the writer's error, unchanged
        parquet_columns(pa.schema([("e", pa.struct([]))]))


def test_width_plan_samples_the_named_columns_of_a_large_first_row_group() -> None:
    wide = np.array([-2**62, 2**62] * PLAN_MIN_ROWS, dtype=np.int64)
    table = pa.table({"a": wide, "b": wide, "c": np.arange(len(wide))})
    everything = FileLayout(table.schema)
    everything.plan(table)
    assert everything.plain == {"a", "b"}
    named = FileLayout(table.schema)
    named.plan(table, ["b", "c"])  # "a" taken as narrow (a constant, say)
    assert named.plain == {"b"}
    small = FileLayout(table.schema)
    small.plan(table.slice(0, PLAN_MIN_ROWS - 1))
    assert small.plain == set()  # not planned: every integer column delta-packed
    assert small.options([], [], [])["column_encoding"] == {
        "a": "DELTA_BINARY_PACKED", "b": "DELTA_BINARY_PACKED", "c": "DELTA_BINARY_PACKED"}
