"""Every type family of issue 4 scope item 1, captured end to end by snapshot AND by stream,
under each handling mode (issue 4 "How it is shown": a real table with edge values captured
by snapshot and by stream).

The converter-level tests (``test_types_scalars.py``, ``test_types_complex.py``, unit
``test_typeconv_*``) pin every encoding to the seeds' values (TYPE-01..26, CFG-39..48). This
test closes the loop through the real pipeline: the snapshot (binary COPY, its vectorised fast
paths, Spark tasks) and the stream (pgoutput text, the envelope) must store exactly the
reference bronze value of every column and row, a REPLICA IDENTITY FULL update's ``before``
must equal the snapshot's image, and silver must hold the reference native value for rows
that came by snapshot and by stream alike.
"""

from __future__ import annotations

import math
from typing import Any

import psycopg2
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.cdc.typeconv import TypeModes
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.silver import live_rows
from tests.integration.test_types_support import copy_texts

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SETUP = """
CREATE EXTENSION IF NOT EXISTS hstore; CREATE EXTENSION IF NOT EXISTS citext;
CREATE EXTENSION IF NOT EXISTS ltree;
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN price AS numeric(8,3) CHECK (VALUE >= 0);
CREATE DOMAIN code AS varchar(6);
"""

# name: (DDL type, three rows of SQL literals); a fourth row is all NULL.
COLUMNS: dict[str, tuple[str, tuple[str, str, str]]] = {
    "bo": ("boolean", ("true", "false", "true")),
    "b1": ("bit(1)", ("B'1'", "B'0'", "B'1'")),
    "bn": ("bit(12)", ("B'000000000101'", "B'111111111111'", "B'100000000000'")),
    "vb": ("varbit", ("B'101'", "B''", "B'0001'")),
    "i2": ("smallint", ("0", "-32768", "32767")),
    "i4": ("integer", ("1", "-2147483648", "2147483647")),
    "i8": ("bigint", ("2", "-9223372036854775808", "9223372036854775807")),
    "oi": ("oid", ("0", "1", "4294967295")),
    "f4": ("real", ("1.5", "'-Infinity'", "'NaN'")),
    "f8": ("double precision", ("-0.25", "1e-300", "'Infinity'")),
    "ch": ("char(5)", ("'ab'", "'ünï'", "''")),
    "vc": ("varchar(20)", ("'x'", "'日本語'", "''")),
    "tx": ("text", ("'text'", "E'tab\\tnew\\nline \\\\ q\"'", "''")),
    "cit": ("citext", ("'MiXeD'", "'ß'", "''")),
    "tstz": ("timestamptz", ("'2018-06-20 15:13:16.945104+02'", "'infinity'",
                             "'-infinity'")),
    "tstz0": ("timestamptz(0)", ("'2018-06-20 15:13:16+00'", "'0044-03-15 12:00:00+00 BC'",
                                 "'12345-06-01 00:00:00+00'")),
    "ttz": ("timetz", ("'09:43:16.945104+05'", "'24:00:00+00'", "'00:00:00-12'")),
    "d": ("date", ("'2018-06-20'", "'infinity'", "'0044-03-15 BC'")),
    "t3": ("time(3)", ("'15:13:16.945'", "'00:00:00'", "'23:59:59.999'")),
    "t6": ("time", ("'15:13:16.945104'", "'24:00:00'", "'00:00:00'")),
    "ts3": ("timestamp(3)", ("'2018-06-20 15:13:16.945'", "'infinity'",
                             "'1900-01-01 00:00:00'")),
    "ts6": ("timestamp", ("'2018-06-20 15:13:16.945104'", "'-infinity'",
                          "'0001-01-01 00:00:00'")),
    "iv": ("interval", ("'1 year 2 months 3 days 04:05:06.78'", "'-1 day -00:00:01'", "'0'")),
    "n": ("numeric(10,2)", ("12.34", "-99999999.99", "0")),
    "nv": ("numeric", ("1.50", "-0.000000001", "123456789012345678901234567890.123")),
    "mo": ("money", ("1.5", "-92233720368547758.08", "0")),
    "by": ("bytea", ("'\\x00ff'", "'\\x'", "'\\xdeadbeef'")),
    "js": ("json", ("'{\"a\": [1, null]}'", "'[]'", "'\"ü\"'")),
    "jb": ("jsonb", ("'{\"a\": [1, null]}'", "'{}'", "'\"ü\"'")),
    "x": ("xml", ("'<a>1</a>'", "'<b/>'", "'<c>ä</c>'")),
    "u": ("uuid", ("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
                   "'00000000-0000-0000-0000-000000000000'",
                   "'ffffffff-ffff-ffff-ffff-ffffffffffff'")),
    "lt": ("ltree", ("'Top.Science.Astronomy'", "''", "'a'")),
    "ine": ("inet", ("'192.168.1.5/24'", "'::1'", "'10.0.0.1'")),
    "cid": ("cidr", ("'10.0.0.0/8'", "'2001:db8::/32'", "'0.0.0.0/0'")),
    "mac": ("macaddr", ("'08:00:2b:01:02:03'", "'00:00:00:00:00:00'", "'ff:ff:ff:ff:ff:ff'")),
    "mac8": ("macaddr8", ("'08:00:2b:01:02:03:04:05'", "'00:00:00:00:00:00:00:00'",
                          "'ff:ff:ff:ff:ff:ff:ff:ff'")),
    "pt": ("point", ("'(1,2)'", "'(-1.5,0)'", "'(1e-10,1e10)'")),
    "r4": ("int4range", ("'[1,3)'", "'empty'", "'(,5]'")),
    "r8": ("int8range", ("'[1,9223372036854775806]'", "'empty'", "'[0,)'")),
    "nr": ("numrange", ("'(1.5,2.5]'", "'empty'", "'(,)'")),
    "tr": ("tsrange", ("'[2018-06-20 15:13:16,2018-06-21 00:00:00)'", "'empty'",
                       "'(,infinity)'")),
    "tzr": ("tstzrange", ("'[2018-06-20 15:13:16+02,2018-06-21 00:00:00+00)'", "'empty'",
                          "'[-infinity,)'")),
    "dr": ("daterange", ("'[2018-06-20,2018-06-22]'", "'empty'", "'(,2018-01-01)'")),
    "e": ("mood", ("'ok'", "'sad'", "'happy'")),
    "dp": ("price", ("12.345", "0", "99999.999")),
    "dc": ("code", ("'abc'", "''", "'üüüüüü'")),
    "h": ("hstore", ("'a=>1, b=>NULL'", "''", "'\"ü k\"=>\"x,y\"'")),
    "ai": ("int[]", ("'{1,NULL}'", "'{}'", "'{-2147483648,2147483647}'")),
    "at": ("text[]", ("'{\"a b\",NULL,\"\"}'", "'{}'", "'{\"ü\",\"q\\\"\"}'")),
    "an": ("numeric(5,2)[]", ("'{1.5,NULL}'", "'{}'", "'{-999.99}'")),
    "ad": ("date[]", ("'{2018-06-20,NULL}'", "'{}'", "'{infinity}'")),
    "atz": ("timestamptz[]", ("'{\"2018-06-20 15:13:16.945104+02\"}'", "'{}'", "'{NULL}'")),
    "au": ("uuid[]", ("'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}'", "'{}'", "'{NULL}'")),
    "aj": ("jsonb[]", ("ARRAY['{\"a\": 1}'::jsonb, NULL]", "'{}'", "ARRAY['[]'::jsonb]")),
    "ae": ("mood[]", ("'{ok,sad}'", "'{}'", "'{NULL}'")),
    "bx": ("box", ("'((0,0),(1,1))'", "'((-1,-1),(0,0))'", "'((2,2),(3,3))'")),
}
"""``bx`` (box) is a type Debezium does not know: dropped, or opaque with
``include.unknown.datatypes``."""

MODES = {
    "defaults": TypeModes(),
    "connect-double-string-base64-map-unknown": TypeModes(
        time_precision="connect", decimal="double", interval="string", binary="base64",
        hstore="map", include_unknown=True),
    "micro-string-hex": TypeModes(time_precision="adaptive_time_microseconds",
                                  decimal="string", binary="hex"),
}


def _norm(value: Any) -> Any:
    """Comparable form: NaN equal to NaN, maps as sorted pairs."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    return value


def _create(conn) -> None:
    with conn.cursor() as cur:
        cur.execute(SETUP)
        cols = ", ".join(f"{name} {ddl}" for name, (ddl, _) in COLUMNS.items())
        cur.execute(f"CREATE TABLE w (id int PRIMARY KEY, {cols})")
        cur.execute("ALTER TABLE w REPLICA IDENTITY FULL")
        names = ", ".join(COLUMNS)
        for row in range(3):
            values = ", ".join(lits[row] for _, lits in COLUMNS.values())
            cur.execute(f"INSERT INTO w (id, {names}) VALUES ({row + 1}, {values})")
        cur.execute("INSERT INTO w (id) VALUES (4)")


@pytest.mark.parametrize("mode", list(MODES))
def test_every_type_by_snapshot_and_stream(pg_dsn, pg_conn, spark, lakehouse, mode):
    modes = MODES[mode]
    try:
        _create(pg_conn)
    except psycopg2.Error as exc:  # pragma: no cover - the extensions ship with postgresql-15
        pytest.skip(f"an extension is missing: {exc.pgerror or exc}")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.w",),
                               slot="types", publication="types", modes=modes)
    texts = {name: pa.array(copy_texts(pg_conn, f"SELECT {name} FROM w ORDER BY id"),
                            pa.string()) for name in COLUMNS}
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        names = ", ".join(COLUMNS)
        cur.execute(f"INSERT INTO w (id, {names}) SELECT id + 1000, {names} FROM w")
        cur.execute("UPDATE w SET i4 = 42 WHERE id IN (1, 4)")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)

    (ctx,) = load_contexts(settings)
    captured = [c.bronze_field.name for c in ctx.converters]
    assert ("bx" in captured) == modes.include_unknown
    ids = [1, 2, 3, 4]
    reference = {}
    for conv in ctx.converters:
        name = conv.bronze_field.name
        if name != "id":  # the reference encodings of the values as first inserted
            reference[name] = (conv.to_bronze(texts[name]).to_pylist(),
                               conv.to_silver(texts[name]).to_pylist())
    bronze = DeltaTable(ctx.bronze_uri).to_pyarrow_table().to_pylist()
    snap = {r["after"]["id"]: r["after"] for r in bronze if r["op"] == "r"}
    streamed = {r["after"]["id"] - 1000: r["after"] for r in bronze if r["op"] == "c"}
    updates = {r["after"]["id"]: r for r in bronze if r["op"] == "u"}
    assert sorted(snap) == ids and sorted(streamed) == ids and sorted(updates) == [1, 4]
    for name, (want, _) in reference.items():
        for i, k in enumerate(ids):
            expected = _norm(want[i])
            assert _norm(snap[k][name]) == expected, (mode, "snapshot", name, k)
            assert _norm(streamed[k][name]) == expected, (mode, "stream", name, k)
            if k in updates:  # REPLICA IDENTITY FULL: the whole old row, every type
                assert _norm(updates[k]["before"][name]) == expected, (mode, "before", name, k)
                if name != "i4":
                    assert _norm(updates[k]["after"][name]) == expected, (mode, "after", name)
    assert [updates[k]["after"]["i4"] for k in (1, 4)] == [42, 42]

    silver = {r["id"]: r for r in live_rows(ctx.silver_uri).to_pylist()}
    assert sorted(silver) == [*ids, *(k + 1000 for k in ids)]
    for name, (_, want) in reference.items():
        for i, k in enumerate(ids):
            expected = _norm(42 if name == "i4" and k in (1, 4) else want[i])
            assert _norm(silver[k][name]) == expected, (mode, "silver", name, k)
            assert _norm(silver[k + 1000][name]) == _norm(want[i]), (mode, "silver", name, k)
    assert table_uri(str(lakehouse), "silver", "public", "w") == ctx.silver_uri
