"""Debezium's PostgreSQL message events and transaction metadata records as JSON.

* Logical decoding messages (``op = m``; EVT-15, EVT-25, STR-59..62), from
  ``bronze/_pgcdc/messages``: topic ``<prefix>.message``, key
  ``io.debezium.connector.postgresql.MessageKey`` {prefix}, value
  ``io.debezium.connector.postgresql.MessageValue`` {op, ts_ms, source, message{prefix,
  content}}, the content encoded per ``binary.handling.mode`` (Debezium's
  ``LogicalDecodingMessageMonitor``).
* Transaction metadata (STR-65..68), from ``bronze/_pgcdc/transactions``: topic
  ``<prefix>.transaction``, key ``io.debezium.connector.common.TransactionMetadataKey`` {id},
  value ``...TransactionMetadataValue`` {status, id, event_count, data_collections, ts_ms}.
"""

from __future__ import annotations

import base64

from pgcdc_dagster.cdc.debezium_json import (
    DEFAULT_FORMAT,
    TRANSACTION_BLOCK,
    DebeziumRecord,
    Json,
    Row,
    debezium_format,
    prim,
    sanitize_topic,
    source_payload,
    source_schema,
    struct_schema,
)
from pgcdc_dagster.exceptions import ConfigurationError

MESSAGE_KEY_NAME = "io.debezium.connector.postgresql.MessageKey"
MESSAGE_VALUE_NAME = "io.debezium.connector.postgresql.MessageValue"
MESSAGE_BLOCK_NAME = "io.debezium.connector.postgresql.Message"
TX_KEY_NAME = "io.debezium.connector.common.TransactionMetadataKey"
TX_VALUE_NAME = "io.debezium.connector.common.TransactionMetadataValue"
TX_COLLECTION_NAME = "event.collection"
BINARY_MODES = ("bytes", "base64", "base64-url-safe", "hex")


def _content_schema(binary_mode: str) -> Json:
    if binary_mode not in BINARY_MODES:
        raise ConfigurationError(
            f"binary.handling.mode = {binary_mode!r} is not supported; use one of "
            f"{', '.join(BINARY_MODES)}")
    return prim("bytes" if binary_mode == "bytes" else "string", True, "content")


def _content(data: bytes | None, binary_mode: str) -> str | None:
    if data is None:
        return None
    if binary_mode in ("bytes", "base64"):
        return base64.b64encode(data).decode("ascii")
    if binary_mode == "base64-url-safe":
        return base64.urlsafe_b64encode(data).decode("ascii")
    return data.hex()


def message_to_json(row: Row, topic_prefix: str, *, fmt: str = DEFAULT_FORMAT,
                    binary_mode: str = "bytes",
                    replace_null_with_default: bool = True) -> DebeziumRecord:
    """A logical decoding message row (``bronze/_pgcdc/messages``) as Debezium writes it.

    Topic ``<prefix>.message``; key ``MessageKey`` {prefix} (STR-60); value ``MessageValue``
    {op ``m``, ts_ms, source (empty schema and table, STR-61), (3.6: transaction, null),
    message {prefix, content}}
    with the content per ``binary.handling.mode`` (EVT-15, EVT-25).
    """
    version = debezium_format(fmt)
    message = row.get("message") or {}
    prefix = message.get("prefix")
    key = {"schema": struct_schema([prim("string", True, "prefix")], optional=False,
                             name=MESSAGE_KEY_NAME, version=1),
           "payload": {"prefix": prefix}}
    block = struct_schema([prim("string", True, "prefix"), _content_schema(binary_mode)],
                          optional=not version.origin, name=MESSAGE_BLOCK_NAME, version=1,
                          field="message")
    fields = [prim("string", False, "op"), prim("int64", True, "ts_ms"),
              source_schema(version)]
    payload: Json = {"op": row.get("op") or "m", "ts_ms": row.get("ts_ms"),
                     "source": source_payload(
                         row["source"], version,
                         replace_null_with_default=replace_null_with_default)}
    if version.origin:  # 3.6: the transaction block (null), and a required message
        fields.append(TRANSACTION_BLOCK)
        payload["transaction"] = None
    fields.append(block)
    payload["message"] = {"prefix": prefix,
                          "content": _content(message.get("content"), binary_mode)}
    schema = struct_schema(fields, optional=False, name=MESSAGE_VALUE_NAME, version=1)
    return DebeziumRecord(sanitize_topic(f"{topic_prefix}.message"), key,
                          {"schema": schema, "payload": payload})


def transaction_to_json(row: Row, topic_prefix: str) -> DebeziumRecord:
    """A BEGIN/END row (``bronze/_pgcdc/transactions``) as Debezium writes it (STR-66..68)."""
    key = {"schema": struct_schema([prim("string", False, "id")], optional=False,
                             name=TX_KEY_NAME, version=1),
           "payload": {"id": row.get("id")}}
    collection = struct_schema([prim("string", False, "data_collection"),
                          prim("int64", False, "event_count")],
                         optional=True, name=TX_COLLECTION_NAME, version=1)
    collections: Json = {"type": "array", "items": collection, "optional": True,
                         "field": "data_collections"}
    schema = struct_schema([prim("string", False, "status"), prim("string", False, "id"),
                      prim("int64", True, "event_count"), collections,
                      prim("int64", False, "ts_ms")],
                     optional=False, name=TX_VALUE_NAME, version=1)
    data = row.get("data_collections")
    payload = {
        "status": row.get("status"), "id": row.get("id"), "event_count": row.get("event_count"),
        "data_collections": None if data is None else [
            {"data_collection": d.get("data_collection"), "event_count": d.get("event_count")}
            for d in data],
        "ts_ms": row.get("ts_ms"),
    }
    return DebeziumRecord(sanitize_topic(f"{topic_prefix}.transaction"), key,
                          {"schema": schema, "payload": payload})
