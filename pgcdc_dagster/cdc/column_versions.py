"""Versioned bronze fields: how a column whose type changes keeps its history in bronze.

Bronze is append-only and stays reader v1 / writer v2, so a field's Delta type can never
change in place, and a value stored under one Debezium encoding must never be re-read under
another. When a column's encoding changes (``ALTER COLUMN ... TYPE``), the
events after the change store the column in a new bronze field ``<column>__v<n>`` (n = 2,
3, ...), whose metadata names the column (``pgcdc.column``); the old field keeps the old
events' values untouched. The choice is a pure function of the bronze schema, so every run
(snapshot, stream, silver, export) picks the same field:

* the column's newest field (``<column>``, then ``__v2``, ...) is reused when it is
  :func:`compatible` with the column's current encoding;
* otherwise a field numbered one above the newest is created.

Compatible means that the old values decode to the same thing under the new schema: the same
Arrow storage type, the same Debezium semantic name, the same decoding parameters
(``scale``, Bits ``length``, ``masked``). Metadata that does not change the decoding (a
``varchar`` length, ``connect.decimal.precision``, enum labels, propagated source types, NOT
NULL) keeps the field. So ``numeric(10,2) -> numeric(12,2)`` stays in place, while
``int -> bigint``, ``int -> text`` and ``numeric(10,2) -> numeric(12,4)`` get a new field.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.typeconv import ColumnConverter

COLUMN_META = b"pgcdc.column"
"""Field metadata key naming the source column of a versioned field."""
_VERSIONED = re.compile(r"^(?P<column>.+)__v(?P<n>[0-9]+)$")
_NEUTRAL_PARAMS = ("connect.decimal.precision", "allowed", "truncateLength")
_NEUTRAL_PREFIX = "__debezium.source.column."


def versioned_name(column: str, version: int) -> str:
    """``<column>__v<n>`` (version 1 is the column's own name)."""
    return column if version <= 1 else f"{column}__v{version}"


def column_of(field: pa.Field) -> str:
    """The source column a bronze field stores (its own name unless it is versioned)."""
    raw = (field.metadata or {}).get(COLUMN_META)
    return raw.decode() if raw is not None else str(field.name)


def version_of(field: pa.Field) -> int:
    """1 for a column's own field, n for ``<column>__v<n>``."""
    if (field.metadata or {}).get(COLUMN_META) is None:
        return 1
    match = _VERSIONED.match(field.name)
    return int(match.group("n")) if match else 1


def versions(fields: Iterable[pa.Field], column: str) -> list[pa.Field]:
    """The bronze fields of ``column``, oldest first."""
    found = [f for f in fields if column_of(f) == column]
    return sorted(found, key=version_of)


def same_storage(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal Arrow types, nested nullability and metadata ignored."""
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return a.num_fields == b.num_fields and all(
            a.field(i).name == b.field(i).name and same_storage(a.field(i).type, b.field(i).type)
            for i in range(a.num_fields))
    for pred in (pa.types.is_list, pa.types.is_large_list):
        if pred(a) and pred(b):
            return same_storage(a.value_type, b.value_type)
    if pa.types.is_map(a) and pa.types.is_map(b):
        return same_storage(a.key_type, b.key_type) and same_storage(a.item_type, b.item_type)
    return bool(a == b)


def _meta(field: pa.Field, key: str) -> str | None:
    raw = (field.metadata or {}).get(key.encode())
    return raw.decode() if raw is not None else None


def _decoding_params(field: pa.Field) -> dict[str, Any]:
    params = json.loads(_meta(field, "debezium.parameters") or "{}")
    return {k: v for k, v in params.items()
            if k not in _NEUTRAL_PARAMS and not k.startswith(_NEUTRAL_PREFIX)}


def _nested_schema_key(field: pa.Field) -> object:
    """The decoding-relevant part of nested schemas (array items, struct fields)."""
    raw = _meta(field, "debezium.schema")
    if raw is None:
        return None

    def strip(schema: Any) -> Any:
        if isinstance(schema, dict):
            out = {k: strip(v) for k, v in schema.items()
                   if k not in ("optional", "default", "doc", "field")}
            params = {k: v for k, v in (schema.get("parameters") or {}).items()
                      if k not in _NEUTRAL_PARAMS and not k.startswith(_NEUTRAL_PREFIX)}
            out.pop("parameters", None)
            if params:
                out["parameters"] = params
            return out
        if isinstance(schema, list):
            return [strip(v) for v in schema]
        return schema

    return strip(json.loads(raw))


def compatible(old: pa.Field, new: pa.Field) -> bool:
    """True when values stored under ``old`` read the same under ``new`` (see module doc)."""
    if not same_storage(old.type, new.type):
        return False
    if _meta(old, "debezium.name") != _meta(new, "debezium.name"):
        return False
    if _decoding_params(old) != _decoding_params(new):
        return False
    return _nested_schema_key(old) == _nested_schema_key(new)


def assign_field(column: str, field: pa.Field, committed: Sequence[pa.Field],
                 pending: Sequence[pa.Field] = (), columns: Iterable[str] = ()) -> str:
    """The bronze field name that stores ``column`` encoded as ``field``.

    The name is never one that another column's field holds or that another column of the
    table is named (Delta Lake compares names without letter case): a source column really
    named ``c__v2`` keeps ``c__v2``, and ``c``'s next version skips to ``c__v3``; a column
    added under the name of an existing versioned field gets a versioned field of its own
    (``c__v2__v2``, its ``pgcdc.column`` metadata naming it). Field names stay injective.

    Args:
        column: The source column.
        field: The column's bronze field under its current encoding.
        committed: The fields of bronze's ``after`` struct (the committed schema).
        pending: Fields already chosen in this run but not committed yet.
        columns: The table's current column names (reserved for their own fields).
    """
    have = versions(committed, column)
    if have and compatible(have[-1], field):
        return str(have[-1].name)
    chosen = versions(pending, column)
    for f in reversed(chosen):
        if compatible(f, field):
            return str(f.name)
    taken = {str(f.name).lower() for f in (*committed, *pending) if column_of(f) != column}
    taken.update(c.lower() for c in columns if c != column)
    version = max((version_of(f) for f in (*have, *chosen)), default=0) + 1
    while versioned_name(column, version).lower() in taken:
        version += 1
    return versioned_name(column, version)


class VersionedConverter:
    """A converter whose bronze field is a versioned name (``<column>__v<n>``).

    Everything but the bronze field's name (and its ``pgcdc.column`` metadata) is the wrapped
    converter's: the values, the silver field, the Debezium schema (whose ``field`` stays the
    column's name). ``superseded`` holds converters of the column's older bronze fields,
    newest first, so silver can read every event's value from the field it was written to.
    Picklable (Spark snapshot tasks carry converters).
    """

    dropped = False

    def __init__(self, base: ColumnConverter, name: str,
                 superseded: Sequence[ColumnConverter] = ()) -> None:
        self.base = base
        self.column = column_of(base.bronze_field)
        meta = dict(base.bronze_field.metadata or {})
        if name != self.column:
            meta[COLUMN_META] = self.column.encode()
        self.bronze_field = pa.field(name, base.bronze_field.type, base.bronze_field.nullable,
                                     metadata=meta)
        self.superseded = tuple(superseded)
        self.silver_field = base.silver_field
        if self.superseded:
            chain = [old.silver_field for old in reversed(self.superseded)]
            self.silver_field = with_silver_chain(base.silver_field, chain)

    def __repr__(self) -> str:
        return f"VersionedConverter({self.bronze_field.name!r}, {self.base!r})"

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # during unpickling, before __dict__ is restored
            raise AttributeError(name)
        return getattr(self.base, name)

    def to_bronze(self, text: pa.Array) -> pa.Array:
        return self.base.to_bronze(text)

    def to_silver(self, text: pa.Array) -> pa.Array:
        return self.base.to_silver(text)

    def from_bronze(self, values: pa.Array | pa.ChunkedArray) -> pa.Array:
        return self.base.from_bronze(values)

    def bronze_fallback(self) -> pa.Scalar:
        return self.base.bronze_fallback()

    def bronze_placeholder(self) -> pa.Scalar | None:
        return self.base.bronze_placeholder()

    def to_json(self, value: object) -> object:
        return self.base.to_json(value)

    def connect_schema(self) -> dict[str, Any]:
        return self.base.connect_schema()


def renamed(conv: ColumnConverter, name: str,
            superseded: Sequence[ColumnConverter] = ()) -> ColumnConverter:
    """``conv`` storing its bronze values in field ``name`` (itself when nothing changes)."""
    if name == conv.bronze_field.name and not superseded:
        return conv
    base = conv.base if isinstance(conv, VersionedConverter) else conv
    return VersionedConverter(base, name, superseded)


def superseded_of(conv: ColumnConverter) -> tuple[ColumnConverter, ...]:
    """The converters of a column's older bronze fields, newest first (none if unversioned)."""
    return tuple(getattr(conv, "superseded", ()))


SILVER_CHAIN_META = b"pgcdc.silver_chain"
"""Silver field metadata: the silver types of the column's older versions, oldest first
(an Arrow IPC schema, base64), so a stored value is cast through each type in turn, as
PostgreSQL converted it at each ALTER (``int -> numeric(6,1) -> text`` gives ``4.0``)."""


def with_silver_chain(field: pa.Field, older: Sequence[pa.Field]) -> pa.Field:
    """``field`` with the silver types of its older versions in its metadata."""
    schema = pa.schema([f.with_name(f"v{i}").with_metadata({}) for i, f in enumerate(older)])
    blob = base64.b64encode(schema.serialize().to_pybytes())
    return field.with_metadata({**(field.metadata or {}), SILVER_CHAIN_META: blob})


def silver_chain(field: pa.Field) -> list[pa.DataType]:
    """The silver types a value passes through to reach ``field``: its older versions',
    oldest first, then its own."""
    blob = (field.metadata or {}).get(SILVER_CHAIN_META)
    if blob is None:
        return [field.type]
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(blob)))
    return [*(f.type for f in schema), field.type]


def cast_through(values: pa.Array, chain: Sequence[pa.DataType]) -> pa.Array:
    """``values`` cast along ``chain`` from the first type after the one they have (the
    whole chain when their type is not in it); the result has the chain's last type."""
    def equivalent(a: pa.DataType, b: pa.DataType) -> bool:
        texts = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
        if any(t(a) for t in texts) and any(t(b) for t in texts):
            return True
        return same_storage(a, b)

    start = 0
    for i, typ in enumerate(chain):
        if equivalent(values.type, typ):
            start = i + 1
    for typ in chain[start:]:
        values = safe_cast(values, typ)
    return values


def safe_cast(values: pa.Array, typ: pa.DataType) -> pa.Array:
    """Arrow's safe cast; to a narrow decimal through a wide one (Arrow refuses casting an
    integer to a decimal whose precision cannot hold every integer, even when the values
    fit; the second cast checks the values)."""
    if values.type == typ:
        return values
    try:
        return values.cast(typ, safe=True)
    except pa.ArrowInvalid:
        if not (pa.types.is_decimal(typ) and (pa.types.is_integer(values.type)
                                              or pa.types.is_decimal(values.type))):
            raise
        return values.cast(pa.decimal128(38, typ.scale), safe=True).cast(typ, safe=True)


def silver_values(conv: ColumnConverter, children: Mapping[str, pa.Array], n: int) -> pa.Array:
    """The silver values of one column from a batch of bronze images.

    Each event's value is in the bronze field it was written to: the converter's own field,
    or (events from before a type change) one of its superseded fields, decoded with that
    field's converter and cast to the current silver type. An event has a value in exactly
    one of them, so the first non-null wins. A column added after the events reads null.
    """
    # Imported here: silver_values depends on typeconv only, but keeps this module light.
    from pgcdc_dagster.cdc.silver_values import from_bronze

    target = conv.silver_field.type
    name = conv.bronze_field.name
    out = from_bronze(conv, children[name]) if name in children else pa.nulls(n, target)
    superseded = superseded_of(conv)
    for j, old in enumerate(superseded):
        field = old.bronze_field.name
        if field not in children:
            continue
        older = from_bronze(old, children[field])
        if older.null_count == len(older):
            continue
        # through the silver types of the newer versions, as PostgreSQL converted it
        newer = [s.silver_field.type for s in reversed(superseded[:j])]
        out = pc.coalesce(out, _through(older, (*newer, target)))
    return out


def _through(values: pa.Array, chain: Sequence[pa.DataType]) -> pa.Array:
    """``values`` cast through each type of ``chain`` in turn; straight to its last type when
    a step cannot hold them. Version numbers follow the order the fields were created in,
    which is not always the order of the types in time: a column renamed and then retyped
    within one window has its newest type in the plain field (claimed from the catalog when
    the run started) and its older values in ``__v2`` (``int -> bigint``: a bigint value
    cannot pass through the int32 of the "newer" version)."""
    out = values
    try:
        for typ in chain:
            out = safe_cast(out, typ)
        return out
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return safe_cast(values, chain[-1])
