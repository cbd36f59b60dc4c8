"""Arrays of any supported element type (TYPE-25), including NULL elements, empty arrays and
multi-dimensional arrays.

The array's text output (``{1,NULL,"a b"}``, ``{{1,2},{3,4}}``, ``[0:1]={7,8}``) is parsed per
value; all elements of the column are then converted in one call of the element converter, so
every element encoding is exactly the scalar one. Bronze: ARRAY of the element schema (elements
optional, except enum elements, which Debezium declares as required ``io.debezium.data.Enum``
with the allowed labels; the Arrow item field stays nullable so that a NULL element, which
Debezium cannot emit, is stored as null instead of failing the write); silver: ``list`` of the
element's silver type.

Dimensions: PostgreSQL does not enforce the declared dimensions. A column is converted with
``dimensions`` nesting levels (``attndims``, default 1). A value with more dimensions than
that is flattened in row-major order into the innermost level, one with fewer is wrapped;
explicit lower bounds (``[0:1]=``) are dropped. Debezium itself has no multi-dimensional
support.

Unchanged-TOAST placeholders follow Debezium's ``UnchangedToastedPlaceholder``: text, varchar,
json and jsonb arrays hold ``[placeholder]``; int4 and date arrays the placeholder's octets as
INT32 values, int8 arrays as INT64 values; other arrays have none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from pgcdc_dagster.cdc.typeconv.base import BaseConverter
from pgcdc_dagster.cdc.typeconv.model import PgType, TypeModes
from pgcdc_dagster.cdc.typeconv.schema import ConnectSchema

Nested = list[Any]
Build = Callable[[str, PgType, int, TypeModes, bool], BaseConverter]

_TEXT_PLACEHOLDER = frozenset({"text", "varchar", "json", "jsonb"})
_INT_PLACEHOLDER = {"int4": pa.int32(), "date": pa.int32(), "int8": pa.int64()}


def parse_array(text: str, delimiter: str = ",") -> Nested:
    """PostgreSQL array text output -> nested lists of element texts (None for NULL)."""
    pos = 0
    if text.startswith("["):
        pos = text.index("=") + 1
    result, _ = _parse_level(text, pos, delimiter)
    return result


def _parse_level(text: str, pos: int, delim: str) -> tuple[Nested, int]:
    assert text[pos] == "{", f"malformed array literal {text!r}"
    pos += 1
    items: Nested = []
    if text[pos] == "}":
        return items, pos + 1
    while True:
        ch = text[pos]
        if ch == "{":
            sub, pos = _parse_level(text, pos, delim)
            items.append(sub)
        elif ch == '"':
            pos += 1
            buf: list[str] = []
            while text[pos] != '"':
                if text[pos] == "\\":
                    pos += 1
                buf.append(text[pos])
                pos += 1
            pos += 1
            items.append("".join(buf))
        else:
            start = pos
            while text[pos] != delim and text[pos] != "}":
                pos += 1
            token = text[start:pos]
            items.append(None if token.upper() == "NULL" else token)
        if text[pos] == delim:
            pos += 1
            continue
        assert text[pos] == "}", f"malformed array literal {text!r}"
        return items, pos + 1


def _flatten(value: Nested) -> Nested:
    out: Nested = []
    for item in value:
        if isinstance(item, list):
            out.extend(_flatten(item))
        else:
            out.append(item)
    return out


def reshape(value: Nested, depth: int) -> Nested:
    """Give a parsed array exactly ``depth`` nesting levels (see the module docstring)."""
    if depth <= 1:
        return _flatten(value)
    if not value:
        return []
    if all(isinstance(v, list) for v in value):
        return [reshape(v, depth - 1) for v in value]
    return [reshape(value, depth - 1)]


class ArrayConverter(BaseConverter):
    """ARRAY of the element converter's schema; silver ``list<element silver>``."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool, element: BaseConverter, dimensions: int = 1) -> None:
        self.element = element
        self.depth = max(dimensions, 1)
        self.delimiter = element_delimiter(pgtype)
        storage: ConnectSchema = element.schema.as_optional()
        schema = element.schema.required() if _is_enum(element.pgtype) else storage
        silver: pa.DataType = element.silver_field.type
        for _ in range(self.depth):
            schema = ConnectSchema("array", True, items=schema)
            storage = ConnectSchema("array", True, items=storage)
            silver = pa.list_(pa.field("element", silver))
        super().__init__(column, pgtype, typmod, modes, nullable, schema, silver)
        if storage != schema.as_optional():  # required elements stored in a nullable item
            self.bronze_field = pa.field(column, storage.arrow_type(), nullable,
                                         metadata=self.bronze_field.metadata)

    def _split(self, text: pa.StringArray) -> tuple[list[Nested | None], pa.StringArray]:
        rows: list[Nested | None] = []
        leaves: list[str | None] = []
        for value in text.to_pylist():
            if value is None:
                rows.append(None)
                continue
            shaped = reshape(parse_array(value, self.delimiter), self.depth)
            rows.append(shaped)
            leaves.extend(_flatten(shaped))
        flat = pa.array(leaves, type=pa.string())
        assert isinstance(flat, pa.StringArray)
        return rows, flat

    def _assemble(self, rows: list[Nested | None], values: pa.Array,
                  type_: pa.DataType) -> pa.Array:
        levels: list[list[Nested | None]] = [rows]
        for _ in range(self.depth - 1):
            levels.append([item for row in levels[-1] if row is not None for item in row])
        out = values
        for level_rows in reversed(levels):
            lengths = np.array([0 if r is None else len(r) for r in level_rows], dtype=np.int32)
            offsets = np.zeros(len(level_rows) + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            mask = pa.array([r is None for r in level_rows], type=pa.bool_())
            out = pa.ListArray.from_arrays(pa.array(offsets), out, mask=mask)
        return out.cast(type_)

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        rows, flat = self._split(text)
        return self._assemble(rows, self.element.to_bronze(flat), self.bronze_field.type)

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        return _map_lists(values, self.element.from_bronze, self.silver_field.type)

    def bronze_placeholder(self) -> pa.Scalar | None:
        """Debezium's array placeholders (see the module docstring); None for other arrays."""
        name = self.element.pgtype.name
        if self.depth != 1:
            return None
        if name in _TEXT_PLACEHOLDER:
            return pa.scalar([self.modes.placeholder_text], type=self.bronze_field.type)
        if name in _INT_PLACEHOLDER:
            signed = [b - 256 if b > 127 else b for b in self.modes.placeholder_bytes]
            return pa.scalar(signed, type=self.bronze_field.type)
        return None


def _is_enum(pgtype: PgType) -> bool:
    """An enum element type (through domains)."""
    while pgtype.typtype == "d" and pgtype.base is not None:
        pgtype = pgtype.base
    return pgtype.typtype == "e"


def _map_lists(values: pa.Array, fn: Callable[[pa.Array], pa.Array],
               type_: pa.DataType) -> pa.Array:
    """Apply ``fn`` to the leaf values of (nested) lists, keeping offsets and nulls."""
    if values.offset:
        values = pa.concat_arrays([values])  # rebase a slice (from_arrays needs offset 0)
    child_type = type_.value_type
    if pa.types.is_list(values.type.value_type):
        child = _map_lists(values.values, fn, child_type)
    else:
        child = fn(values.values)
    return pa.ListArray.from_arrays(values.offsets, child, mask=values.is_null()).cast(type_)


def element_delimiter(array_type: PgType) -> str:
    """The array text separator: the element type's ``typdelim`` (through domains)."""
    element = array_type.element
    while element is not None:
        if element.delimiter != "," or element.base is None:
            return element.delimiter
        element = element.base
    return ","


def array_converter(column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                    nullable: bool, build: Build, dimensions: int = 1) -> BaseConverter:
    """The converter of an array column, or the element's dropped converter if unknown."""
    assert pgtype.element is not None
    element = build(f"{column}-element", pgtype.element, typmod, modes, True)
    if element.dropped:
        return element
    return ArrayConverter(column, pgtype, typmod, modes, nullable, element, dimensions)
