"""Kafka Connect schemas: one description gives the Arrow type, the JSON schema and JSON values.

Debezium describes every field with a Kafka Connect schema: a literal type (INT16 ... STRUCT),
an optional semantic name and version, a doc string and string parameters. :class:`ConnectSchema`
mirrors that, so that the bronze Arrow type (INT16 -> int16, BYTES -> binary,
ARRAY -> list, MAP -> map, STRUCT -> struct), the ``schema`` part of a Debezium JSON export and
the ``payload`` value encoding (``JsonConverter``: bytes as base64, non-finite floats as strings)
all come from one place.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

_ARROW_PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "string": pa.string(),
    "bytes": pa.binary(),
}

_JSON_TYPE_NAMES = {"float32": "float", "float64": "double"}
"""Where JsonConverter's schema type names differ from Connect's ``Schema.Type`` names
(Kafka's ``JsonSchema.FLOAT_TYPE_NAME`` / ``DOUBLE_TYPE_NAME``)."""


@dataclass(frozen=True, slots=True)
class ConnectSchema:
    """A Kafka Connect schema (``org.apache.kafka.connect.data.Schema``) in JSON-converter terms.

    Attributes:
        type: Literal type in Connect's ``Schema.Type`` spelling (lower case): ``boolean``,
            ``int16``, ``int32``, ``int64``, ``float32``, ``float64``, ``string``, ``bytes``,
            ``array``, ``map``, ``struct``; :meth:`json_schema` writes JsonConverter's
            names (``float`` and ``double`` for the two floating types).
        optional: Whether the value may be null.
        name: Semantic type name, e.g. ``io.debezium.time.Date``.
        version: Semantic type version (Debezium's logical types use 1).
        doc: Schema doc string.
        parameters: Schema parameters as (key, value) string pairs, in declaration order.
        fields: Struct fields as (name, schema) pairs.
        items: Array element schema.
        keys: Map key schema.
        values: Map value schema.
        default: The field's default value in its JsonConverter form (Debezium propagates a
            column's parseable default, TYPE-19..22; ``cdc/typeconv/defaults.py``); None: no
            default (Kafka Connect writes no ``default`` for a null one).
    """

    type: str
    optional: bool = True
    name: str | None = None
    version: int | None = None
    doc: str | None = None
    parameters: tuple[tuple[str, str], ...] = ()
    fields: tuple[tuple[str, ConnectSchema], ...] = ()
    items: ConnectSchema | None = None
    keys: ConnectSchema | None = None
    values: ConnectSchema | None = None
    default: Any = None

    def arrow_type(self) -> pa.DataType:
        """The Arrow type that stores this literal type in bronze."""
        if self.type in _ARROW_PRIMITIVES:
            return _ARROW_PRIMITIVES[self.type]
        if self.type == "array":
            assert self.items is not None
            return pa.list_(self.items.arrow_field("item"))
        if self.type == "map":
            assert self.keys is not None and self.values is not None
            return pa.map_(self.keys.arrow_field("key"), self.values.arrow_field("value"))
        if self.type == "struct":
            return pa.struct([s.arrow_field(n) for n, s in self.fields])
        raise ValueError(f"unknown Kafka Connect type {self.type!r}")

    def arrow_field(self, name: str) -> pa.Field:
        """An Arrow field of this schema, its metadata describing the semantic type."""
        meta = self.arrow_metadata()
        return pa.field(name, self.arrow_type(), self.optional, metadata=meta or None)

    def arrow_metadata(self) -> dict[str, str]:
        """Field metadata: semantic name, version, parameters and the whole JSON schema."""
        meta: dict[str, str] = {"debezium.type": self.type.upper()}
        if self.name is not None:
            meta["debezium.name"] = self.name
        if self.version is not None:
            meta["debezium.version"] = str(self.version)
        if self.parameters:
            meta["debezium.parameters"] = json.dumps(dict(self.parameters))
        meta["debezium.schema"] = json.dumps(self.json_schema(), separators=(",", ":"))
        return meta

    def json_schema(self, field: str | None = None) -> dict[str, Any]:
        """The schema as Kafka Connect's JsonConverter writes it (``schemas.enable=true``)."""
        out: dict[str, Any] = {"type": _JSON_TYPE_NAMES.get(self.type, self.type)}
        if self.type == "array" and self.items is not None:
            out["items"] = self.items.json_schema()
        elif self.type == "map" and self.keys is not None and self.values is not None:
            out["keys"] = self.keys.json_schema()
            out["values"] = self.values.json_schema()
        elif self.type == "struct":
            out["fields"] = [s.json_schema(field=n) for n, s in self.fields]
        out["optional"] = self.optional
        if self.name is not None:
            out["name"] = self.name
        if self.version is not None:
            out["version"] = self.version
        if self.doc is not None:
            out["doc"] = self.doc
        if self.parameters:
            out["parameters"] = dict(self.parameters)
        if self.default is not None:
            out["default"] = self.default
        if field is not None:
            out["field"] = field
        return out

    def json_value(self, value: object) -> object:
        """A bronze value (``to_pylist`` form) -> the JSON value JsonConverter writes.

        BYTES become base64 strings; FLOAT NaN/Infinity become the strings Jackson writes
        (``"NaN"``, ``"Infinity"``, ``"-Infinity"``); MAP with string keys becomes an object.
        """
        if value is None:
            return None
        if self.type == "bytes":
            assert isinstance(value, bytes | bytearray | memoryview)
            return base64.b64encode(bytes(value)).decode("ascii")
        if self.type in ("float32", "float64"):
            assert isinstance(value, float | int)
            f = float(value)
            if math.isnan(f):
                return "NaN"
            if math.isinf(f):
                return "Infinity" if f > 0 else "-Infinity"
            return f
        if self.type == "array":
            assert self.items is not None and isinstance(value, list)
            return [self.items.json_value(v) for v in value]
        if self.type == "map":
            assert self.keys is not None and self.values is not None
            pairs = value.items() if isinstance(value, dict) else value
            assert isinstance(pairs, list | type({}.items()))
            if self.keys.type == "string":
                return {k: self.values.json_value(v) for k, v in pairs}
            return [[self.keys.json_value(k), self.values.json_value(v)] for k, v in pairs]
        if self.type == "struct":
            assert isinstance(value, dict)
            return {n: s.json_value(value.get(n)) for n, s in self.fields}
        return value

    def required(self) -> ConnectSchema:
        """The same schema with ``optional = False``."""
        return dataclasses.replace(self, optional=False)

    def as_optional(self) -> ConnectSchema:
        """The same schema with ``optional = True``."""
        return dataclasses.replace(self, optional=True)


def primitive(kind: str, name: str | None = None, *, version: int | None = None,
              parameters: tuple[tuple[str, str], ...] = ()) -> ConnectSchema:
    """An optional schema of a primitive literal type with an optional semantic name.

    Debezium's semantic types are version 1 unless told otherwise.
    """
    if name is not None and version is None:
        version = 1
    return ConnectSchema(kind, True, name, version, None, parameters)
