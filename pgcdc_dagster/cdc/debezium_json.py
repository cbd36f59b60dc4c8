"""Bronze rows as Debezium JSON: what Kafka Connect's JsonConverter writes with schemas on.

One bronze row (a dict from ``to_pylist``) becomes a record of two messages, the key and the
value, each ``{"schema": ..., "payload": ...}`` (EVT-01), or ``None`` where Kafka would carry
a null (the key of a truncate, EVT-16/STR-53; the value of a tombstone, STR-71).

Schemas follow the JsonConverter's layout (``type``, ``items``/``keys``/``values``/``fields``,
``optional``, ``name``, ``version``, ``doc``, ``parameters``, ``default``, then ``field``), and
payload fields follow the schema's field order:

* key: struct ``<prefix>.<schema>.<table>.Key`` of the key columns (EVT-04/05/08; a table's
  key after ``message.key.columns``);
* value: struct ``<prefix>.<schema>.<table>.Envelope`` (EVT-09/10) with ``before``/``after``
  (optional ``<...>.Value``, EVT-11), ``source`` (``io.debezium.connector.postgresql.Source``,
  EVT-17..20, D-05, D-06), ``transaction`` (optional ``event.block``, EVT-14/STR-69), ``op``
  (EVT-12), ``ts_ms`` (EVT-13) and, as Debezium 2.6+ writes them, ``ts_us``/``ts_ns``;
* message events (``op = m``, EVT-15/25, STR-60/61): key ``io.debezium.connector.postgresql.
  MessageKey`` {prefix}, value ``...MessageValue`` {op, ts_ms, source, message{prefix,
  content}}, the content encoded per ``binary.handling.mode``;
* transaction metadata records (STR-66/67): ``io.debezium.connector.common.Transaction
  MetadataKey`` / ``...TransactionMetadataValue``.

The layout is Debezium's own code, not the seeds' illustrations, where they differ (the seeds'
key example writes ``"INT32"``, ``"index"`` and string booleans; its ``source`` omits
``sequence`` and types ``snapshot`` as a boolean): see ``docs/debezium-json.md``.
Column values are encoded by each field's Kafka Connect schema (``ConnectSchema.json_value``:
bytes as base64, a precise Decimal as the base64 of its unscaled bytes, NaN/Infinity as
strings), with FLOAT32 values written as Java's ``Float.toString`` digits.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.typeconv import ColumnConverter, ConnectSchema
from pgcdc_dagster.cdc.typeconv.javafmt import java_double_string
from pgcdc_dagster.exceptions import ConfigurationError

Json = dict[str, Any]
Row = Mapping[str, Any]

SOURCE_SCHEMA_NAME = "io.debezium.connector.postgresql.Source"
TRANSACTION_BLOCK_NAME = "event.block"
MESSAGE_KEY_NAME = "io.debezium.connector.postgresql.MessageKey"
MESSAGE_VALUE_NAME = "io.debezium.connector.postgresql.MessageValue"
MESSAGE_BLOCK_NAME = "io.debezium.connector.postgresql.Message"
TX_KEY_NAME = "io.debezium.connector.common.TransactionMetadataKey"
TX_VALUE_NAME = "io.debezium.connector.common.TransactionMetadataValue"
TX_COLLECTION_NAME = "event.collection"
PROPAGATED_PREFIX = "__debezium.source.column."


@dataclass(frozen=True, slots=True)
class DebeziumFormat:
    """The details that differ between the Debezium releases an export can imitate.

    Attributes:
        name: The release line, e.g. ``"3.1"``.
        snapshot_allowed: ``allowed`` of the ``source.snapshot`` Enum schema.
        source_version: ``version`` of the Source struct schema (None: not written).
    """

    name: str
    snapshot_allowed: str
    source_version: int | None


FORMATS: dict[str, DebeziumFormat] = {
    "2.7": DebeziumFormat("2.7", "true,last,false,incremental", None),
    "3.1": DebeziumFormat(
        "3.1", "true,first,first_in_data_collection,last_in_data_collection,last,false,"
        "incremental", 1),
}
"""Release lines whose JsonConverter output this module reproduces. 3.x is the default: its
``snapshot`` Enum admits every marker the snapshot writes (``first``, ``last_in_data_collection``
...); 2.7 admits only ``true,last,false,incremental``."""

DEFAULT_FORMAT = "3.1"
ENVELOPE_VERSION = 2
BINARY_MODES = ("bytes", "base64", "base64-url-safe", "hex")


def debezium_format(name: str) -> DebeziumFormat:
    """The :class:`DebeziumFormat` of a release line, with a clear error for others."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigurationError(
            f"Debezium JSON format {name!r} is not supported; use one of "
            f"{', '.join(sorted(FORMATS))}") from None


# Schemas ---------------------------------------------------------------------------------

def _prim(kind: str, optional: bool, field: str) -> Json:
    return {"type": kind, "optional": optional, "field": field}


def _struct(fields: list[Json], *, optional: bool, name: str | None = None,
            version: int | None = None, field: str | None = None) -> Json:
    out: Json = {"type": "struct", "fields": fields, "optional": optional}
    if name is not None:
        out["name"] = name
    if version is not None:
        out["version"] = version
    if field is not None:
        out["field"] = field
    return out


def source_schema(fmt: DebeziumFormat, field: str | None = "source") -> Json:
    """``io.debezium.connector.postgresql.Source`` (EVT-17..20; D-05 string Enum, D-06)."""
    snapshot: Json = {"type": "string", "optional": True, "name": "io.debezium.data.Enum",
                      "version": 1, "parameters": {"allowed": fmt.snapshot_allowed},
                      "default": "false", "field": "snapshot"}
    fields = [
        _prim("string", False, "version"), _prim("string", False, "connector"),
        _prim("string", False, "name"), _prim("int64", False, "ts_ms"), snapshot,
        _prim("string", False, "db"), _prim("string", True, "sequence"),
        _prim("int64", True, "ts_us"), _prim("int64", True, "ts_ns"),
        _prim("string", False, "schema"), _prim("string", False, "table"),
        _prim("int64", True, "txId"), _prim("int64", True, "lsn"), _prim("int64", True, "xmin"),
    ]
    return _struct(fields, optional=False, name=SOURCE_SCHEMA_NAME, version=fmt.source_version,
                   field=field)


TRANSACTION_BLOCK: Json = _struct(
    [_prim("string", False, "id"), _prim("int64", False, "total_order"),
     _prim("int64", False, "data_collection_order")],
    optional=True, name=TRANSACTION_BLOCK_NAME, version=1, field="transaction")
"""The envelope's ``transaction`` field (EVT-14, STR-69)."""


def schema_from_json(schema: Mapping[str, Any]) -> ConnectSchema:
    """A :class:`ConnectSchema` from its JsonConverter form (inverse of ``json_schema``)."""
    kind = str(schema["type"])
    params = tuple((str(k), str(v)) for k, v in (schema.get("parameters") or {}).items())
    fields = tuple((str(f["field"]), schema_from_json(f)) for f in schema.get("fields") or ())
    items = schema_from_json(schema["items"]) if "items" in schema else None
    keys = schema_from_json(schema["keys"]) if "keys" in schema else None
    values = schema_from_json(schema["values"]) if "values" in schema else None
    version = schema.get("version")
    return ConnectSchema(kind, bool(schema.get("optional", True)), schema.get("name"),
                         int(version) if version is not None else None, schema.get("doc"),
                         params, fields, items, keys, values)


# Java number formatting ------------------------------------------------------------------

def float32_value(value: float) -> float:
    """The float whose shortest digits are ``Float.toString`` of the FLOAT32 ``value``."""
    if math.isnan(value) or math.isinf(value) or value == 0:
        return value
    target = _as_float32(value)
    for digits in range(1, 10):
        candidate = float(f"{target:.{digits}g}")
        if _as_float32(candidate) == target:
            return candidate
    return target


def _as_float32(value: float) -> float:
    rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return rounded


def _java_numbers(schema: Mapping[str, Any], value: Any) -> Any:
    """Give FLOAT32 values (at any depth) their Java ``Float.toString`` digits."""
    if value is None:
        return None
    kind = schema.get("type")
    if kind == "float32" and isinstance(value, float):
        return float32_value(value)
    if kind == "array" and isinstance(value, list) and "items" in schema:
        return [_java_numbers(schema["items"], v) for v in value]
    if kind == "struct" and isinstance(value, dict):
        by_name = {f["field"]: f for f in schema.get("fields", ())}
        return {k: _java_numbers(by_name[k], v) if k in by_name else v
                for k, v in value.items()}
    if kind == "map" and isinstance(value, dict) and "values" in schema:
        return {k: _java_numbers(schema["values"], v) for k, v in value.items()}
    return value


# Fields and tables -----------------------------------------------------------------------

@dataclass(frozen=True)
class FieldCodec:
    """One column of a Key or Value struct: its schema fragment and its value encoder."""

    name: str
    schema: Json
    """The JsonConverter schema of the field, without ``field``."""
    encode: Callable[[object], object]

    def field_schema(self) -> Json:
        return {**self.schema, "field": self.name}

    def value(self, raw: object) -> object:
        return _java_numbers(self.schema, self.encode(raw))

    @classmethod
    def of_converter(cls, conv: ColumnConverter) -> FieldCodec:
        schema = dict(conv.connect_schema())
        schema.pop("field", None)
        return cls(conv.bronze_field.name, schema, conv.to_json)

    @classmethod
    def of_arrow_field(cls, field: pa.Field) -> FieldCodec:
        """From a bronze field's ``debezium.schema`` metadata (what bronze stores)."""
        raw = (field.metadata or {}).get(b"debezium.schema")
        if raw is None:
            raise ConfigurationError(
                f"bronze field {field.name!r} has no debezium.schema metadata; export it "
                "with the table's converters instead (table_codec)")
        schema = json.loads(raw)
        schema.pop("field", None)
        return cls(field.name, schema, schema_from_json(schema).json_value)

    def as_key(self) -> FieldCodec:
        """The field as Debezium writes it in a key: no column mapper parameters.

        Debezium builds key fields without the column mappers, so a key field never carries
        ``column.propagate.source.type`` parameters (EVT-06).
        """
        params = {k: v for k, v in (self.schema.get("parameters") or {}).items()
                  if not k.startswith(PROPAGATED_PREFIX)}
        schema = {k: v for k, v in self.schema.items() if k != "parameters"}
        if params:
            schema = _with_parameters(schema, params)
        return FieldCodec(self.name, schema, self.encode)


def _with_parameters(schema: Json, params: Mapping[str, str]) -> Json:
    """Insert ``parameters`` where the JsonConverter writes it (before ``default``)."""
    out: Json = {}
    for key, value in schema.items():
        if key == "default":
            out["parameters"] = dict(params)
        out[key] = value
    if "parameters" not in out:
        out["parameters"] = dict(params)
    return out


_AVRO_FIRST = re.compile(r"[A-Za-z_]")
_AVRO_REST = re.compile(r"[A-Za-z0-9_.]")
_TOPIC_INVALID = re.compile(r"[^A-Za-z0-9._\-]")


def adjust_schema_name(name: str, mode: str = "none") -> str:
    """``schema.name.adjustment.mode``: ``none`` (Debezium 2.x default) or ``avro`` (EVT-30)."""
    if mode == "none":
        return name
    if mode != "avro":
        raise ConfigurationError(
            f"schema.name.adjustment.mode = {mode!r} is not supported; use none or avro")
    out = [c if (_AVRO_FIRST if i == 0 else _AVRO_REST).fullmatch(c) else "_"
           for i, c in enumerate(name)]
    return "".join(out)


def topic_name(prefix: str, schema: str, table: str) -> str:
    """``<topic.prefix>.<schema>.<table>`` with invalid topic characters replaced (EVT-27)."""
    return _TOPIC_INVALID.sub("_", f"{prefix}.{schema}.{table}")


@dataclass(frozen=True)
class DebeziumRecord:
    """One Kafka record: topic, key message and value message (None = Kafka null)."""

    topic: str
    key: Json | None
    value: Json | None

    def to_json_line(self) -> str:
        """``{"topic", "key", "value"}`` as one compact JSON line."""
        return dumps({"topic": self.topic, "key": self.key, "value": self.value})


@dataclass(frozen=True)
class TableCodec:
    """Key and value schemas of one captured table, and the encoding of its bronze rows."""

    topic: str
    schema_prefix: str
    """``<prefix>.<schema>.<table>`` after name adjustment: the struct names' stem."""
    key_fields: tuple[FieldCodec, ...]
    value_fields: tuple[FieldCodec, ...]
    fmt: DebeziumFormat

    def key_schema(self) -> Json:
        """``<prefix>.<schema>.<table>.Key`` (EVT-08)."""
        return _struct([f.field_schema() for f in self.key_fields], optional=False,
                       name=f"{self.schema_prefix}.Key")

    def row_schema(self, field: str) -> Json:
        """``<prefix>.<schema>.<table>.Value`` as the ``before``/``after`` field (EVT-10)."""
        return _struct([f.field_schema() for f in self.value_fields], optional=True,
                       name=f"{self.schema_prefix}.Value", field=field)

    def value_schema(self) -> Json:
        """``<prefix>.<schema>.<table>.Envelope`` (EVT-09), in Debezium's field order."""
        fields = [self.row_schema("before"), self.row_schema("after"), source_schema(self.fmt),
                  TRANSACTION_BLOCK, _prim("string", False, "op"),
                  _prim("int64", True, "ts_ms"), _prim("int64", True, "ts_us"),
                  _prim("int64", True, "ts_ns")]
        out = _struct(fields, optional=False, name=f"{self.schema_prefix}.Envelope")
        out["version"] = ENVELOPE_VERSION
        return out

    def _image(self, image: Mapping[str, Any] | None) -> Json | None:
        if image is None:
            return None
        return {f.name: f.value(image.get(f.name)) for f in self.value_fields}

    def key_message(self, row: Row) -> Json | None:
        """The key message; None for rows without a key (truncate, EVT-16; keyless, EVT-07)."""
        key = row.get("key")
        if key is None or not self.key_fields:
            return None
        payload = {f.name: f.value(key.get(f.name)) for f in self.key_fields}
        return {"schema": self.key_schema(), "payload": payload}

    def value_message(self, row: Row, *, transaction_metadata: bool = False) -> Json | None:
        """The value message; None for a tombstone (``op`` null, STR-71/72).

        ``transaction_metadata`` is ``provide.transaction.metadata``: off, the ``transaction``
        field is null, as Debezium writes it by default.
        """
        op = row.get("op")
        if op is None:
            return None
        ts_ms = row.get("ts_ms")
        tx = row.get("transaction") if transaction_metadata else None
        payload: Json = {
            "before": self._image(row.get("before")),
            "after": self._image(row.get("after")),
            "source": source_payload(row["source"]),
            "transaction": _transaction_payload(tx),
            "op": op,
            "ts_ms": ts_ms,
            "ts_us": None if ts_ms is None else int(ts_ms) * 1000,
            "ts_ns": None if ts_ms is None else int(ts_ms) * 1_000_000,
        }
        return {"schema": self.value_schema(), "payload": payload}

    def record(self, row: Row, *, transaction_metadata: bool = False) -> DebeziumRecord:
        """Key and value of one bronze row."""
        return DebeziumRecord(self.topic, self.key_message(row),
                              self.value_message(row, transaction_metadata=transaction_metadata))


def source_payload(source: Mapping[str, Any]) -> Json:
    """The ``source`` payload from bronze's source struct; ``ts_ns`` from ``ts_us``."""
    ts_us = source.get("ts_us")
    return {
        "version": source.get("version"), "connector": source.get("connector"),
        "name": source.get("name"), "ts_ms": source.get("ts_ms"),
        "snapshot": source.get("snapshot"), "db": source.get("db"),
        "sequence": source.get("sequence"), "ts_us": ts_us,
        "ts_ns": None if ts_us is None else int(ts_us) * 1000,
        "schema": source.get("schema"), "table": source.get("table"),
        "txId": source.get("txId"), "lsn": source.get("lsn"), "xmin": source.get("xmin"),
    }


def _transaction_payload(tx: Mapping[str, Any] | None) -> Json | None:
    if tx is None or tx.get("id") is None:
        return None
    return {"id": tx["id"], "total_order": tx.get("total_order"),
            "data_collection_order": tx.get("data_collection_order")}


def table_codec(relation: Relation, converters: Sequence[ColumnConverter], topic_prefix: str,
                *, fmt: str = DEFAULT_FORMAT, schema_name_adjustment: str = "none"
                ) -> TableCodec:
    """The codec of a table from its (captured) relation and converters.

    Key fields are the relation's key columns (``message.key.columns`` applied by
    ``build_context``), value fields every converter, in relation order.
    """
    fields = [FieldCodec.of_converter(c) for c in converters]
    by_name = {f.name: f for f in fields}
    keys = tuple(by_name[c.name].as_key() for c in relation.columns if c.is_key)
    return _codec(topic_prefix, relation.namespace, relation.name, keys, tuple(fields), fmt,
                  schema_name_adjustment)


def table_codec_from_bronze(bronze: pa.Schema, topic_prefix: str, schema: str, table: str, *,
                            fmt: str = DEFAULT_FORMAT, schema_name_adjustment: str = "none"
                            ) -> TableCodec:
    """The codec of a table from its bronze Arrow schema (the ``debezium.schema`` metadata
    bronze keeps on every ``key`` and ``after`` field): no database connection needed."""
    value = bronze.field("after").type
    key = bronze.field("key").type
    values = tuple(FieldCodec.of_arrow_field(value.field(i)) for i in range(value.num_fields))
    keys = tuple(FieldCodec.of_arrow_field(key.field(i)).as_key()
                 for i in range(key.num_fields))
    return _codec(topic_prefix, schema, table, keys, values, fmt, schema_name_adjustment)


def _codec(prefix: str, schema: str, table: str, keys: tuple[FieldCodec, ...],
           values: tuple[FieldCodec, ...], fmt: str, adjustment: str) -> TableCodec:
    stem = adjust_schema_name(f"{prefix}.{schema}.{table}", adjustment)
    return TableCodec(topic_name(prefix, schema, table), stem, keys, values,
                      debezium_format(fmt))


def event_to_json(row: Row, relation: Relation, converters: Sequence[ColumnConverter],
                  topic_prefix: str, *, fmt: str = DEFAULT_FORMAT,
                  transaction_metadata: bool = False) -> DebeziumRecord:
    """One bronze change-event row as Debezium's key and value messages.

    Args:
        row: The row as read back from bronze (``to_pylist``): ``key``, ``before``,
            ``after``, ``source``, ``op``, ``ts_ms``, ``transaction``.
        relation: The captured relation (key columns flagged).
        converters: The table's converters, in relation order.
        topic_prefix: Debezium ``topic.prefix``.
        fmt: Debezium release line to imitate (:data:`FORMATS`).
        transaction_metadata: ``provide.transaction.metadata``.
    """
    codec = table_codec(relation, converters, topic_prefix, fmt=fmt)
    return codec.record(row, transaction_metadata=transaction_metadata)


# Message events and transaction records --------------------------------------------------

def _content_schema(binary_mode: str) -> Json:
    if binary_mode not in BINARY_MODES:
        raise ConfigurationError(
            f"binary.handling.mode = {binary_mode!r} is not supported; use one of "
            f"{', '.join(BINARY_MODES)}")
    return _prim("bytes" if binary_mode == "bytes" else "string", True, "content")


def _content(data: bytes | None, binary_mode: str) -> str | None:
    if data is None:
        return None
    if binary_mode in ("bytes", "base64"):
        return base64.b64encode(data).decode("ascii")
    if binary_mode == "base64-url-safe":
        return base64.urlsafe_b64encode(data).decode("ascii")
    return data.hex()


def message_to_json(row: Row, topic_prefix: str, *, fmt: str = DEFAULT_FORMAT,
                    binary_mode: str = "bytes") -> DebeziumRecord:
    """A logical decoding message row (``bronze/_pgcdc/messages``) as Debezium writes it.

    Topic ``<prefix>.message``; key ``MessageKey`` {prefix} (STR-60); value ``MessageValue``
    {op ``m``, ts_ms, source (empty schema and table, STR-61), message {prefix, content}}
    with the content per ``binary.handling.mode`` (EVT-15, EVT-25).
    """
    version = debezium_format(fmt)
    message = row.get("message") or {}
    prefix = message.get("prefix")
    key = {"schema": _struct([_prim("string", True, "prefix")], optional=False,
                             name=MESSAGE_KEY_NAME, version=1),
           "payload": {"prefix": prefix}}
    block = _struct([_prim("string", True, "prefix"), _content_schema(binary_mode)],
                    optional=True, name=MESSAGE_BLOCK_NAME, version=1, field="message")
    schema = _struct([_prim("string", False, "op"), _prim("int64", True, "ts_ms"),
                      source_schema(version), block],
                     optional=False, name=MESSAGE_VALUE_NAME, version=1)
    payload = {"op": row.get("op") or "m", "ts_ms": row.get("ts_ms"),
               "source": source_payload(row["source"]),
               "message": {"prefix": prefix,
                           "content": _content(message.get("content"), binary_mode)}}
    return DebeziumRecord(_TOPIC_INVALID.sub("_", f"{topic_prefix}.message"), key,
                          {"schema": schema, "payload": payload})


def transaction_to_json(row: Row, topic_prefix: str) -> DebeziumRecord:
    """A BEGIN/END row (``bronze/_pgcdc/transactions``) as Debezium writes it (STR-66..68)."""
    key = {"schema": _struct([_prim("string", False, "id")], optional=False,
                             name=TX_KEY_NAME, version=1),
           "payload": {"id": row.get("id")}}
    collection = _struct([_prim("string", False, "data_collection"),
                          _prim("int64", False, "event_count")],
                         optional=True, name=TX_COLLECTION_NAME, version=1)
    collections: Json = {"type": "array", "items": collection, "optional": True,
                         "field": "data_collections"}
    schema = _struct([_prim("string", False, "status"), _prim("string", False, "id"),
                      _prim("int64", True, "event_count"), collections,
                      _prim("int64", False, "ts_ms")],
                     optional=False, name=TX_VALUE_NAME, version=1)
    data = row.get("data_collections")
    payload = {
        "status": row.get("status"), "id": row.get("id"), "event_count": row.get("event_count"),
        "data_collections": None if data is None else [
            {"data_collection": d.get("data_collection"), "event_count": d.get("event_count")}
            for d in data],
        "ts_ms": row.get("ts_ms"),
    }
    return DebeziumRecord(_TOPIC_INVALID.sub("_", f"{topic_prefix}.transaction"), key,
                          {"schema": schema, "payload": payload})


# JSON text -------------------------------------------------------------------------------

def dumps(value: Any) -> str:
    """Compact JSON text as Jackson writes it: UTF-8 text unescaped, doubles as
    ``Double.toString`` (``1.0E10``, ``1.5E-4``), keys in insertion order."""
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            out.append(json.dumps(java_double_string(value)))
        else:
            out.append(java_double_string(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Mapping):
        out.append("{")
        for i, (k, v) in enumerate(value.items()):
            if i:
                out.append(",")
            out.append(json.dumps(str(k), ensure_ascii=False))
            out.append(":")
            _write(v, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _write(v, out)
        out.append("]")
    else:
        raise TypeError(f"cannot write {type(value).__name__} as JSON")
