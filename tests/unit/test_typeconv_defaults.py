"""Column defaults as Debezium parses them (TYPE-19..22; ``cdc/typeconv/defaults.py``)."""

from __future__ import annotations

import json

import pyarrow as pa
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
    ("test_enum", "'V1'::test_enum", None),                   # not flagged as an enum
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


def test_enum_default_is_its_label():
    assert default_text("mood", "'ok'::mood", enum=True) == "ok"


def test_not_null_null_becomes_the_default():
    """A NOT NULL column's null (a delete's old-key image) is written as the column's
    default, as the real Debezium 3.6 writes it; the type's zero without a default."""
    conv = converter_for("n", pg("int4"), -1, TypeModes(), nullable=False)
    assert conv.to_bronze(pa.array([None], pa.string())).to_pylist() == [0]
    out = with_default(conv, "int4", "42")
    assert out.to_bronze(pa.array([None, "7"], pa.string())).to_pylist() == [42, 7]
    tz = converter_for("t", pg("timestamptz"), -1, TypeModes(), nullable=False)
    now = with_default(tz, "timestamptz", "now()")
    assert now.to_bronze(pa.array([None], pa.string())).to_pylist() == [
        "1970-01-01T00:00:00.000000Z"]
