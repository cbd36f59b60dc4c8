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
  (EVT-12), ``ts_ms`` (EVT-13) and, as Debezium 2.6+ writes them, ``ts_us``/``ts_ns``.

Message events and transaction metadata records are in ``debezium_records.py``; the JSON
text (Jackson's number formats) in ``jackson.py``.

The layout is Debezium's own code, not the seeds' illustrations, where they differ (the seeds'
key example writes ``"INT32"``, ``"index"`` and string booleans; its ``source`` omits
``sequence`` and types ``snapshot`` as a boolean): see ``docs/debezium-json.md``.
Column values are encoded by each field's Kafka Connect schema (``ConnectSchema.json_value``:
bytes as base64, a precise Decimal as the base64 of its unscaled bytes, NaN/Infinity as
strings), with FLOAT32 values written as Java's ``Float.toString`` digits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.column_versions import column_of, version_of
from pgcdc_dagster.cdc.jackson import dumps, java_numbers
from pgcdc_dagster.cdc.typeconv import ColumnConverter, ConnectSchema
from pgcdc_dagster.exceptions import ConfigurationError

Json = dict[str, Any]
Row = Mapping[str, Any]

SOURCE_SCHEMA_NAME = "io.debezium.connector.postgresql.Source"
TRANSACTION_BLOCK_NAME = "event.block"
PROPAGATED_PREFIX = "__debezium.source.column."


@dataclass(frozen=True, slots=True)
class DebeziumFormat:
    """The details that differ between the Debezium releases an export can imitate.

    Attributes:
        name: The release line, e.g. ``"3.1"``.
        snapshot_allowed: ``allowed`` of the ``source.snapshot`` Enum schema.
        source_version: ``version`` of the Source struct schema (None: not written).
        origin: ``source.origin`` / ``source.origin_lsn`` (3.6: the replication origin of the
            change, null unless the source was itself written by logical replication) and
            a ``transaction`` field in a message's value.
    """

    name: str
    snapshot_allowed: str
    source_version: int | None
    origin: bool = False


_SNAPSHOT_MARKERS_3 = ("true,first,first_in_data_collection,last_in_data_collection,last,false,"
                      "incremental")
FORMATS: dict[str, DebeziumFormat] = {
    "2.7": DebeziumFormat("2.7", "true,last,false,incremental", None),
    "3.1": DebeziumFormat("3.1", _SNAPSHOT_MARKERS_3, 1),
    "3.6": DebeziumFormat("3.6", _SNAPSHOT_MARKERS_3, 1, origin=True),
}
"""Release lines whose JsonConverter output this module reproduces. 3.6 is the default (held
against the real Debezium 3.6.3 by ``tests/integration/test_debezium_differential.py``): its
Source struct ends with ``origin`` and ``origin_lsn``, and its message values have a
``transaction`` field. 3.1 has neither; its ``snapshot`` Enum admits every marker the
snapshot writes (``first``, ``last_in_data_collection`` ...), as 3.6's does; 2.7 admits only
``true,last,false,incremental``."""

DEFAULT_FORMAT = "3.6"
ENVELOPE_VERSION = 2


def debezium_format(name: str) -> DebeziumFormat:
    """The :class:`DebeziumFormat` of a release line, with a clear error for others."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigurationError(
            f"Debezium JSON format {name!r} is not supported; use one of "
            f"{', '.join(sorted(FORMATS))}") from None


# Schemas ---------------------------------------------------------------------------------

def prim(kind: str, optional: bool, field: str) -> Json:
    return {"type": kind, "optional": optional, "field": field}


def struct_schema(fields: list[Json], *, optional: bool, name: str | None = None,
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
        prim("string", False, "version"), prim("string", False, "connector"),
        prim("string", False, "name"), prim("int64", False, "ts_ms"), snapshot,
        prim("string", False, "db"), prim("string", True, "sequence"),
        prim("int64", True, "ts_us"), prim("int64", True, "ts_ns"),
        prim("string", False, "schema"), prim("string", False, "table"),
        prim("int64", True, "txId"), prim("int64", True, "lsn"), prim("int64", True, "xmin"),
    ]
    if fmt.origin:
        fields += [prim("string", True, "origin"), prim("int64", True, "origin_lsn")]
    return struct_schema(fields, optional=False, name=SOURCE_SCHEMA_NAME,
                         version=fmt.source_version, field=field)


TRANSACTION_BLOCK: Json = struct_schema(
    [prim("string", False, "id"), prim("int64", False, "total_order"),
     prim("int64", False, "data_collection_order")],
    optional=True, name=TRANSACTION_BLOCK_NAME, version=1, field="transaction")
"""The envelope's ``transaction`` field (EVT-14, STR-69)."""


_CONNECT_TYPE_NAMES = {"float": "float32", "double": "float64"}
"""JsonConverter's floating type names back to Connect's ``Schema.Type`` spelling."""


_PARAMETER_ORDER = ("scale", "connect.decimal.precision", f"{PROPAGATED_PREFIX}type",
                    f"{PROPAGATED_PREFIX}length", f"{PROPAGATED_PREFIX}scale")
"""Schema parameters in the order Debezium adds them (Decimal's, then the propagated source
type's); others keep their place after these."""


def _parameter_rank(item: tuple[str, str]) -> int:
    name = item[0]
    return _PARAMETER_ORDER.index(name) if name in _PARAMETER_ORDER else len(_PARAMETER_ORDER)


def schema_from_json(schema: Mapping[str, Any]) -> ConnectSchema:
    """A :class:`ConnectSchema` from its JsonConverter form (inverse of ``json_schema``)."""
    kind = _CONNECT_TYPE_NAMES.get(str(schema["type"]), str(schema["type"]))
    params = tuple(sorted(((str(k), str(v)) for k, v in (schema.get("parameters") or {}).items()),
                          key=_parameter_rank))
    fields = tuple((str(f["field"]), schema_from_json(f)) for f in schema.get("fields") or ())
    items = schema_from_json(schema["items"]) if "items" in schema else None
    keys = schema_from_json(schema["keys"]) if "keys" in schema else None
    values = schema_from_json(schema["values"]) if "values" in schema else None
    version = schema.get("version")
    return ConnectSchema(kind, bool(schema.get("optional", True)), schema.get("name"),
                         int(version) if version is not None else None, schema.get("doc"),
                         params, fields, items, keys, values, schema.get("default"))


# Fields and tables -----------------------------------------------------------------------

@dataclass(frozen=True)
class FieldCodec:
    """One column of a Key or Value struct: its schema fragment and its value encoder."""

    name: str
    schema: Json
    """The JsonConverter schema of the field, without ``field``."""
    encode: Callable[[object], object]
    source: str | None = None
    """The bronze field holding the value when it is not ``name`` (a column whose type
    changed is stored in a versioned field, ``cdc/column_versions.py``)."""

    @property
    def stored(self) -> str:
        """The bronze field name the value is read from."""
        return self.source or self.name

    def field_schema(self) -> Json:
        return {**self.schema, "field": self.name}

    def value(self, raw: object, replace_null_with_default: bool = True) -> object:
        """The JSON value; a null becomes the schema's ``default`` when
        ``replace_null_with_default`` (the JsonConverter's ``replace.null.with.default``)."""
        if raw is None and replace_null_with_default and "default" in self.schema:
            return self.schema["default"]
        return java_numbers(self.schema, self.encode(raw))

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
        column = column_of(field)
        return cls(column, schema, schema_from_json(schema).json_value,
                   field.name if column != field.name else None)

    @classmethod
    def of_history(cls, column: Mapping[str, Any]) -> FieldCodec:
        """From one column of a schema-history shape (``lake/schema_history.py``).

        The history stores schemas with sorted keys (a stable shape id); the round trip
        through :class:`ConnectSchema` writes them in JsonConverter's order again (``type``
        first, ``field`` last), as the export of a table without history does.
        """
        schema = schema_from_json(column["schema"]).json_schema()
        name, stored = str(column["name"]), str(column["field"])
        return cls(name, schema, schema_from_json(schema).json_value,
                   stored if stored != name else None)

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
        return FieldCodec(self.name, schema, self.encode, self.source)


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


def sanitize_topic(name: str) -> str:
    """Replace the characters a Kafka topic name cannot hold by ``_`` (EVT-30)."""
    return _TOPIC_INVALID.sub("_", name)


def topic_name(prefix: str, schema: str, table: str) -> str:
    """``<topic.prefix>.<schema>.<table>`` with invalid topic characters replaced (EVT-27)."""
    return sanitize_topic(f"{prefix}.{schema}.{table}")


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
        return struct_schema([f.field_schema() for f in self.key_fields], optional=False,
                       name=f"{self.schema_prefix}.Key")

    def row_schema(self, field: str) -> Json:
        """``<prefix>.<schema>.<table>.Value`` as the ``before``/``after`` field (EVT-10)."""
        return struct_schema([f.field_schema() for f in self.value_fields], optional=True,
                       name=f"{self.schema_prefix}.Value", field=field)

    def value_schema(self) -> Json:
        """``<prefix>.<schema>.<table>.Envelope`` (EVT-09), in Debezium's field order."""
        fields = [self.row_schema("before"), self.row_schema("after"), source_schema(self.fmt),
                  TRANSACTION_BLOCK, prim("string", False, "op"),
                  prim("int64", True, "ts_ms"), prim("int64", True, "ts_us"),
                  prim("int64", True, "ts_ns")]
        out = struct_schema(fields, optional=False, name=f"{self.schema_prefix}.Envelope")
        out["version"] = ENVELOPE_VERSION
        return out

    def _image(self, image: Mapping[str, Any] | None, replace: bool) -> Json | None:
        if image is None:
            return None
        return {f.name: f.value(image.get(f.stored), replace) for f in self.value_fields}

    def key_message(self, row: Row, *, replace_null_with_default: bool = True) -> Json | None:
        """The key message; None for rows without a key (truncate, EVT-16; keyless, EVT-07)."""
        key = row.get("key")
        if key is None or not self.key_fields:
            return None
        payload = {f.name: f.value(key.get(f.stored), replace_null_with_default)
                   for f in self.key_fields}
        return {"schema": self.key_schema(), "payload": payload}

    def value_message(self, row: Row, *, transaction_metadata: bool = False,
                      replace_null_with_default: bool = True) -> Json | None:
        """The value message; None for a tombstone (``op`` null, STR-71/72).

        ``transaction_metadata`` is ``provide.transaction.metadata``: off, the ``transaction``
        field is null, as Debezium writes it by default. ``replace_null_with_default`` is the
        JsonConverter's ``replace.null.with.default`` (its default, true): a null value of a
        field whose schema has a ``default`` is written as that default.
        """
        op = row.get("op")
        if op is None:
            return None
        ts_ms = row.get("ts_ms")
        tx = row.get("transaction") if transaction_metadata else None
        payload: Json = {
            "before": self._image(row.get("before"), replace_null_with_default),
            "after": self._image(row.get("after"), replace_null_with_default),
            "source": source_payload(row["source"], self.fmt,
                                     replace_null_with_default=replace_null_with_default),
            "transaction": _transaction_payload(tx),
            "op": op,
            "ts_ms": ts_ms,
            "ts_us": None if ts_ms is None else int(ts_ms) * 1000,
            "ts_ns": None if ts_ms is None else int(ts_ms) * 1_000_000,
        }
        return {"schema": self.value_schema(), "payload": payload}

    def record(self, row: Row, *, transaction_metadata: bool = False,
               replace_null_with_default: bool = True) -> DebeziumRecord:
        """Key and value of one bronze row."""
        return DebeziumRecord(
            self.topic, self.key_message(row, replace_null_with_default=replace_null_with_default),
            self.value_message(row, transaction_metadata=transaction_metadata,
                               replace_null_with_default=replace_null_with_default))


def source_payload(source: Mapping[str, Any], fmt: DebeziumFormat, *,
                   replace_null_with_default: bool = True) -> Json:
    """The ``source`` payload from bronze's source struct; ``ts_ns`` from ``ts_us``; in 3.6,
    ``origin`` and ``origin_lsn`` null (pgoutput names no origin for the capture's own
    changes, and bronze keeps none).

    A streamed event's ``snapshot`` is unset in Debezium's source struct: the JsonConverter
    writes the field's default, ``"false"`` (what bronze stores), with
    ``replace.null.with.default`` and null without it.
    """
    ts_us = source.get("ts_us")
    snapshot = source.get("snapshot")
    if snapshot == "false" and not replace_null_with_default:
        snapshot = None
    out: Json = {
        "version": source.get("version"), "connector": source.get("connector"),
        "name": source.get("name"), "ts_ms": source.get("ts_ms"),
        "snapshot": snapshot, "db": source.get("db"),
        "sequence": source.get("sequence"), "ts_us": ts_us,
        "ts_ns": None if ts_us is None else int(ts_us) * 1000,
        "schema": source.get("schema"), "table": source.get("table"),
        "txId": source.get("txId"), "lsn": source.get("lsn"), "xmin": source.get("xmin"),
    }
    if fmt.origin:
        out["origin"] = None
        out["origin_lsn"] = None
    return out


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
    bronze keeps on every ``key`` and ``after`` field): no database connection needed.

    A column stored in several versioned fields is exported once, under its name, with its
    newest field's schema (the schema history gives each event its own: ``table_codec_of_shape``).
    """
    value = bronze.field("after").type
    key = bronze.field("key").type
    newest: dict[str, FieldCodec] = {}
    for i in range(value.num_fields):
        codec = FieldCodec.of_arrow_field(value.field(i))
        if codec.name not in newest or version_of(value.field(i)) > version_of(
                value.field(newest[codec.name].stored)):
            newest[codec.name] = codec
    values = tuple(newest.values())
    keys = tuple(FieldCodec.of_arrow_field(key.field(i)).as_key()
                 for i in range(key.num_fields))
    return _codec(topic_prefix, schema, table, keys, values, fmt, schema_name_adjustment)


def table_codec_of_shape(columns: Sequence[Mapping[str, Any]], topic_prefix: str, schema: str,
                         table: str, *, fmt: str = DEFAULT_FORMAT,
                         schema_name_adjustment: str = "none") -> TableCodec:
    """The codec of a table's events under one schema-history shape (the columns, their
    bronze fields and their Connect schemas at the time of those events)."""
    values = tuple(FieldCodec.of_history(c) for c in columns)
    keys = tuple(v.as_key() for v, c in zip(values, columns, strict=True) if c.get("key"))
    return _codec(topic_prefix, schema, table, keys, values, fmt, schema_name_adjustment)


def _codec(prefix: str, schema: str, table: str, keys: tuple[FieldCodec, ...],
           values: tuple[FieldCodec, ...], fmt: str, adjustment: str) -> TableCodec:
    topic = topic_name(prefix, schema, table)
    stem = adjust_schema_name(topic, adjustment)
    return TableCodec(topic, stem, keys, values,
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
