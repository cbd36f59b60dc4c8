"""Column defaults in the bronze field schema, as Debezium propagates them (TYPE-19..23).

Debezium reads a column's default expression from the catalog (``pg_get_expr`` of
``pg_attrdef``) and, for the types it knows how to parse, puts the value into the field's
Kafka Connect schema (``"default"`` in the JsonConverter schema):

- an inline literal is the text inside the first pair of single quotes
  (``'abc'::character varying`` -> ``abc``), or the raw expression when it has no quote
  (``42``, ``true``, ``1.5``);
- an expression that starts with a function call (``nextval('s'::regclass)``, ``now()``,
  ``CURRENT_TIMESTAMP(6)``, ``gen_random_uuid()``) gives the type's zero (TYPE-21): 0 for
  numbers (so ``serial``/``bigserial``/``smallserial`` columns get ``default 0``, as
  Debezium's own tests expect), false, ``""``, ``{}`` for JSON, the epoch for temporal types,
  the zero UUID; a bare keyword such as ``CURRENT_TIMESTAMP`` is not a call and gives no
  default (TYPE-22);
- an enum's default is its label (``'ok'::mood`` -> ``ok``);
- ``NULL::type``, a value the column's converter cannot read, a type Debezium has no default
  parser for (domains, arrays, bytea, geometric and extension types) and a value that
  is a struct (VariableScaleDecimal, Kafka's KAFKA-12694) give no default.

A NOT NULL column's null (a non-key column of a delete's old-key tuple under REPLICA
IDENTITY DEFAULT) is written as the column's default, as Debezium 3.6 writes it; the type's
zero only for a column without one.

The default is converted by the column's own converter, so it has exactly the encoding of the
column's values (Decimal bytes as base64 in JSON, MicroTimestamp micros, ...). Delta has no
column defaults: the value lives in the bronze field metadata (``debezium.schema``) and in the
Debezium JSON export's schema. Defaults are read when a table's context is built (each run),
so, as TYPE-23 warns for Debezium, a changed default shows from the next run on.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import re

import pyarrow as pa

from pgcdc_dagster.cdc.typeconv.model import ColumnConverter

log = logging.getLogger(__name__)

_FUNCTION_CALL = re.compile(r"^\(?[A-Za-z0-9_]+\((?:.+(?:, ?.+)*)?\)")
_LITERAL = re.compile(r"'(.*?)'")

# PostgreSQL type name -> the zero Debezium gives a function-generated default, written as
# PostgreSQL's text output so that the column's converter reads it (TYPE-21).
_ZEROS: dict[str, str] = {
    "bit": "00", "varbit": "0", "bool": "false",
    "bpchar": "", "varchar": "", "text": "", "xml": "",
    "numeric": "0.0", "float4": "0.0", "float8": "0.0",
    "int2": "0", "int4": "0", "int8": "0",
    "json": "{}", "jsonb": "{}",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "date": "1970-01-01", "time": "00:00:00", "timestamp": "1970-01-01 00:00:00",
    "timestamptz": "1970-01-01 00:00:00+00", "interval": "00:00:00",
}


ENUM_NAME = "io.debezium.data.Enum"


def default_text(type_name: str, expression: str | None, *, enum: bool = False) -> str | None:
    """The text value of a column default as Debezium parses it; None: no default.

    Args:
        type_name: The column's PostgreSQL type name (``typname``: ``int4``, ``varchar``...).
        expression: ``pg_get_expr`` of the column default, None when the column has none.
        enum: The column is of an enum type (its default is the label, ``'ok'::mood``).
    """
    zero = "" if enum else _ZEROS.get(type_name)
    if expression is None or zero is None or expression.startswith("NULL::"):
        return None
    if _FUNCTION_CALL.match(expression):
        text = zero
    elif "'" not in expression:
        text = expression
    else:
        found = _LITERAL.search(expression)
        if found is None:
            return None
        text = found.group(1)
    if type_name == "bool":
        return "t" if text == "true" else "f"
    return text


def with_default(conv: ColumnConverter, type_name: str,
                 expression: str | None) -> ColumnConverter:
    """``conv`` with the column default in its Connect schema, or ``conv`` itself when
    Debezium would propagate none (see the module docstring)."""
    schema = getattr(conv, "schema", None)
    text = default_text(type_name, expression,
                        enum=schema is not None and schema.name == ENUM_NAME)
    if text is None or conv.dropped:
        return conv
    try:
        value = conv.to_bronze(pa.array([text], pa.string())).to_pylist()[0]
    except Exception as exc:  # Debezium too skips a default it cannot parse (and logs it)
        log.warning("column %s: default %r is not a %s value (%s); it is left out of the "
                    "schema", conv.bronze_field.name, expression, type_name, exc)
        return conv
    if value is None or isinstance(value, dict) or schema is None:
        return conv
    out = copy.copy(conv)
    out.default_value = value  # type: ignore[attr-defined]  # a NOT NULL null becomes it
    new_schema = dataclasses.replace(schema, default=conv.to_json(value))
    out.schema = new_schema  # type: ignore[attr-defined]
    meta = dict(conv.bronze_field.metadata or {})
    meta[b"debezium.schema"] = json.dumps(new_schema.json_schema(),
                                          separators=(",", ":")).encode()
    out.bronze_field = conv.bronze_field.with_metadata(meta)
    return out
