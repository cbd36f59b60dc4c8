"""Column defaults as Debezium parses them (TYPE-19..22; ``cdc/typeconv/defaults.py``)."""

from __future__ import annotations

import json

import pytest

from pgcdc_dagster.cdc.typeconv import PgType, TypeModes, converter_for
from pgcdc_dagster.cdc.typeconv.defaults import default_text, with_default


def pg(name: str, typtype: str = "b") -> PgType:
    return PgType(oid=1, schema="pg_catalog", name=name, typtype=typtype, category="X")


@pytest.mark.parametrize(("type_name", "expression", "text"), [
    ("int4", "42", "42"),
    ("int8", "'-9223372036854775808'::bigint", "-9223372036854775808"),
    ("int2", "nextval('t_ss_seq'::regclass)", "0"),          # smallserial: default 0
    ("varchar", "'abc'::character varying", "abc"),
    ("bool", "true", "t"),
    ("bool", "false", "f"),
    ("timestamp", "now()", "1970-01-01 00:00:00"),            # TYPE-21: the epoch
    ("timestamp", "CURRENT_TIMESTAMP", "CURRENT_TIMESTAMP"),  # TYPE-22: not a call
    ("uuid", "gen_random_uuid()", "00000000-0000-0000-0000-000000000000"),
    ("json", "'{}'::json", "{}"),
    ("int4", "NULL::integer", None),
    ("int4", None, None),
    ("test_enum", "'V1'::test_enum", None),                   # no parser for the type
    ("bytea", "'\\x00'::bytea", None),
])
def test_default_text(type_name, expression, text):
    assert default_text(type_name, expression) == text


def test_with_default_in_schema_and_field_metadata():
    conv = converter_for("n", pg("numeric"), (6 << 16 | 2) + 4, TypeModes())
    out = with_default(conv, "numeric", "1.5")
    assert out.connect_schema()["default"] == "AJY="  # Decimal(6,2) 1.50 = 0x0096, base64
    meta = json.loads(out.bronze_field.metadata[b"debezium.schema"])
    assert meta["default"] == "AJY="
    assert "default" not in conv.connect_schema()  # the original is left alone
    # unparseable (CURRENT_TIMESTAMP), unknown-to-Debezium and struct-valued: no default
    ts = converter_for("t", pg("timestamp"), -1, TypeModes())
    assert with_default(ts, "timestamp", "CURRENT_TIMESTAMP") is ts
    vsd = converter_for("v", pg("numeric"), -1, TypeModes())
    assert with_default(vsd, "numeric", "2.5") is vsd
