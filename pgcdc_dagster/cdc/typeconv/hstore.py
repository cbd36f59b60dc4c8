"""HSTORE under ``hstore.handling.mode`` (CFG-41, TYPE-09, D-20).

- ``json`` (default): STRING ``io.debezium.data.Json``, the pairs as a compact JSON object
  written the way Debezium writes it (Jackson, ``{"key":"val"}``, SQL NULL values as
  ``null``) and in Debezium's key order: PgJDBC's ``HStoreConverter`` fills a
  ``java.util.HashMap``, so keys come out in HashMap bucket order, reproduced here.
- ``map``: MAP<STRING, optional STRING>.
- Unchanged TOAST: a one-entry map ``{placeholder: placeholder}`` (as JSON in ``json`` mode).

Silver: ``map<string, string>``, keys sorted (code point order).
"""

from __future__ import annotations

import json

import pyarrow as pa

from pgcdc_dagster.cdc.typeconv.base import BaseConverter, map_values
from pgcdc_dagster.cdc.typeconv.model import PgType, TypeModes
from pgcdc_dagster.cdc.typeconv.schema import ConnectSchema, primitive

MAP_SCHEMA = ConnectSchema("map", True, keys=ConnectSchema("string", False),
                           values=ConnectSchema("string", True))
SILVER_TYPE = pa.map_(pa.string(), pa.string())

Pairs = list[tuple[str, str | None]]


def parse_hstore(text: str) -> Pairs:
    """``"a"=>"1", "b"=>NULL`` -> [("a", "1"), ("b", None)] (PostgreSQL's output order)."""
    pairs: Pairs = []
    pos, n = 0, len(text)
    while pos < n:
        while pos < n and text[pos] in " ,":
            pos += 1
        if pos >= n:
            break
        key, pos = _token(text, pos)
        assert text.startswith("=>", pos), f"malformed hstore {text!r}"
        value, pos = _token(text, pos + 2)
        assert key is not None
        pairs.append((key, value))
    return pairs


def _token(text: str, pos: int) -> tuple[str | None, int]:
    if text[pos] == '"':
        pos += 1
        buf: list[str] = []
        while text[pos] != '"':
            if text[pos] == "\\":
                pos += 1
            buf.append(text[pos])
            pos += 1
        return "".join(buf), pos + 1
    end = pos
    while end < len(text) and text[end] not in ",= ":
        end += 1
    token = text[pos:end]
    return (None if token == "NULL" else token), end


def java_string_hash(value: str) -> int:
    """``String.hashCode()`` over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = value.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def java_hashmap_order(keys: list[str]) -> list[str]:
    """Iteration order of a ``java.util.HashMap`` filled with ``keys`` in this order."""
    capacity = 16
    while len(keys) > capacity * 3 // 4:
        capacity *= 2

    def bucket(key: str) -> int:
        h = java_string_hash(key) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(keys, key=bucket)


def jackson_string(value: str) -> str:
    """A JSON string literal as Jackson writes it (upper-case ``\\u00XX`` escapes)."""
    out = json.dumps(value, ensure_ascii=False)
    return out if "\\u" not in out else _upper_escapes(out)


def _upper_escapes(text: str) -> str:
    parts = text.split("\\u")
    return parts[0] + "".join("\\u" + p[:4].upper() + p[4:] for p in parts[1:])


def hstore_json(pairs: Pairs) -> str:
    """Debezium's JSON text of an hstore value (HashMap order, compact)."""
    values = dict(pairs)
    body = ",".join(
        f"{jackson_string(k)}:{'null' if values[k] is None else jackson_string(values[k] or '')}"
        for k in java_hashmap_order(list(values)))
    return "{" + body + "}"


class HstoreConverter(BaseConverter):
    """HSTORE -> JSON string or MAP; silver ``map<string, string>``."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        self.as_json = modes.hstore == "json"
        schema = primitive("string", "io.debezium.data.Json") if self.as_json else MAP_SCHEMA
        super().__init__(column, pgtype, typmod, modes, nullable, schema, SILVER_TYPE)

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        if self.as_json:
            return map_values(text, lambda v: hstore_json(parse_hstore(v)), pa.string())
        return map_values(text, parse_hstore, self.bronze_field.type)

    def _silver(self, text: pa.StringArray) -> pa.Array:
        return map_values(text, lambda v: sorted(parse_hstore(v)), SILVER_TYPE)

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        if self.as_json:
            return pa.array([None if v is None else sorted(json.loads(v).items())
                             for v in values.to_pylist()], type=SILVER_TYPE)
        return pa.array([None if v is None else sorted(v) for v in values.to_pylist()],
                        type=SILVER_TYPE)

    def _fallback_value(self) -> object:
        return "{}" if self.as_json else []

    def bronze_placeholder(self) -> pa.Scalar | None:
        """``{placeholder: placeholder}`` (JSON text in ``json`` mode)."""
        p = self.modes.placeholder_text
        if self.as_json:
            return pa.scalar(hstore_json([(p, p)]), type=pa.string())
        return pa.scalar([(p, p)], type=self.bronze_field.type)
