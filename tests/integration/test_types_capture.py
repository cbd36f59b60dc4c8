"""Every supported type family, captured end to end by snapshot AND by stream, under each
handling mode (a real table with edge values captured by snapshot and by stream).

The converter-level tests (``test_types_scalars.py``, ``test_types_complex.py``, unit
``test_typeconv_*``) pin every encoding to the seeds' values (TYPE-01..26, CFG-39..48). This
test closes the loop through the real pipeline: the snapshot (text COPY, its vectorised fast
paths, Spark tasks) and the stream (pgoutput text, the envelope) must store exactly the
reference bronze value of every column and row, and a REPLICA IDENTITY FULL update's
``before`` must equal the snapshot's image.

Silver is checked against PostgreSQL, not against the converters: the expected value of
every column and row comes from PostgreSQL itself (psycopg2's typed values, or
PostgreSQL-side ``extract(epoch ...)``, ``::text``, ``trim_scale``, ``hstore_to_matrix``,
``ST_*``; ``tests/support/pg_expect.py``), and silver is read back with delta-rs and with
Spark reading the Delta table's files, for the rows captured by snapshot (ids 1-4) and by
stream (ids 1001-1004). Where silver holds a documented string form (JSON, XML, ranges,
network types, TIME as fixed-width text, TIMETZ in UTC) it is compared to PostgreSQL's own
text; documented lossy modes (decimal double, connect milliseconds, numeric intervals) are
applied to PostgreSQL's exact value on the test side.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from decimal import Decimal
from typing import Any

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
from tests.support.extensions import require_extensions
from tests.support.pg_expect import (
    days,
    delta_rows,
    epoch_array_text,
    epoch_text,
    interval_sql,
    interval_struct,
    micros,
    norm,
    spark_rows,
    time_text,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SETUP = """
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


_norm = norm

_TEXT = "{c}::text"
_Expect = tuple[str, Callable[[Any, TypeModes], Any]]


def _same(v: Any, m: TypeModes) -> Any:
    return norm(v)


def _connect(m: TypeModes) -> bool:
    return m.time_precision == "connect"


def _money(v: Decimal | None, m: TypeModes) -> Decimal | None:
    if v is None or m.decimal == "precise":
        return v
    # double and string modes carry MONEY through a Java double (Debezium's PGmoney.val;
    # string = Double.toString): documented as lossy beyond 2^53 cents
    return Decimal(float(v)).quantize(Decimal("0.01"))


def _tz_utc(c: str) -> str:
    return (f"CASE WHEN {c}::text = '24:00:00+00' THEN '00:00:00Z' "
            f"ELSE replace(({c} AT TIME ZONE 'UTC')::text, '+00', 'Z') END")


# The silver value PostgreSQL says each column holds: an SQL expression over the column and
# the documented silver form of its result (docs/types.md, "The table" / "Special values").
EXPECT: dict[str, _Expect] = {
    "bo": ("{c}", _same),
    "b1": ("{c} = B'1'", _same),
    "bn": (_TEXT, _same),
    "vb": ("ltrim({c}::text, '0')", _same),  # documented: no leading zeros
    "i2": ("{c}", _same), "i4": ("{c}", _same), "i8": ("{c}", _same), "oi": ("{c}", _same),
    "f4": ("{c}::float8", _same),  # the exact float32 value, widened
    "f8": ("{c}", _same),
    "ch": ("{c}", _same), "vc": ("{c}", _same), "tx": ("{c}", _same), "cit": (_TEXT, _same),
    "tstz": (epoch_text("{c}"), lambda v, m: micros(v)),
    "tstz0": (epoch_text("{c}"), lambda v, m: micros(v)),
    "ttz": (_tz_utc("{c}"), _same),
    "d": (epoch_text("{c}"), lambda v, m: days(v)),
    "t3": (epoch_text("{c}"), lambda v, m: time_text(v, 3, millis=_connect(m))),
    "t6": (epoch_text("{c}"), lambda v, m: time_text(v, 6, millis=_connect(m))),
    "ts3": (epoch_text("{c}"), lambda v, m: micros(v, millis=True)),
    "ts6": (epoch_text("{c}"), lambda v, m: micros(v, millis=_connect(m))),
    "iv": (interval_sql("{c}"), lambda v, m: interval_struct(v, m.interval)),
    "n": ("{c}", _same),
    "nv": ("trim_scale({c})::text", _same),  # double mode: compared as doubles below
    "mo": ("{c}::numeric", _money),
    "by": ("{c}", _same),
    "js": (_TEXT, _same), "jb": (_TEXT, _same), "x": (_TEXT, _same), "u": (_TEXT, _same),
    # inet's ::text is text(inet), which always adds the mask; psycopg2 gives the output text
    "lt": (_TEXT, _same), "ine": ("{c}", _same), "cid": (_TEXT, _same),
    "mac": (_TEXT, _same), "mac8": (_TEXT, _same),
    "pt": ("CASE WHEN {c} IS NOT NULL THEN ARRAY[{c}[0], {c}[1]] END",
           lambda v, m: None if v is None else {"x": v[0], "y": v[1]}),
    "r4": (_TEXT, _same), "r8": (_TEXT, _same), "nr": (_TEXT, _same), "tr": (_TEXT, _same),
    "tzr": (_TEXT, _same), "dr": (_TEXT, _same), "e": (_TEXT, _same),
    "dp": ("{c}", _same), "dc": ("{c}", _same),
    "h": ("hstore_to_matrix({c})",
          lambda v, m: None if v is None else sorted((k, x) for k, x in v)),
    "ai": ("{c}", _same), "at": ("{c}", _same), "an": ("{c}", _same),
    "ad": (epoch_array_text("{c}"), lambda v, m: None if v is None else [days(x) for x in v]),
    "atz": (epoch_array_text("{c}"),
            lambda v, m: None if v is None else [micros(x) for x in v]),
    "au": ("{c}::text[]", _same), "aj": ("{c}::text[]", _same), "ae": ("{c}::text[]", _same),
    "bx": (_TEXT, _same),
}


def _pg_expected(conn, modes: TypeModes, names: list[str]) -> dict[str, list[Any]]:
    """Per column, the expected silver value of rows 1..4, computed by PostgreSQL."""
    with conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'")  # the capture sessions' setting (snapshot_read)
        cur.execute("SET extra_float_digits = 3")
        exprs = ", ".join(EXPECT[n][0].format(c=n) for n in names)
        cur.execute(f"SELECT {exprs} FROM w WHERE id <= 4 ORDER BY id")
        rows = cur.fetchall()
    out = {}
    for i, name in enumerate(names):
        vals = [r[i] for r in rows]
        if name == "nv" and modes.decimal == "double":
            with conn.cursor() as cur:
                cur.execute("SELECT nv::float8 FROM w WHERE id <= 4 ORDER BY id")
                vals = [r[0] for r in cur.fetchall()]
            out[name] = vals
            continue
        out[name] = [norm(EXPECT[name][1](v, modes)) for v in vals]
    return out


def _silver_form(name: str, value: Any, modes: TypeModes) -> Any:
    if name == "nv" and modes.decimal == "double" and value is not None:
        return float(value)  # silver holds the double's decimal text (documented, lossy)
    return norm(value)


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
def test_every_type_by_snapshot_and_stream(pg_dsn, pg_conn, spark, lakehouse, mode, caplog):
    """TYPE-01..27 through snapshot and stream; TYPE-12/CFG-44: with
    ``include.unknown.datatypes`` off the box column is left out of events and a warning
    naming it is logged."""
    modes = MODES[mode]
    caplog.set_level(logging.WARNING)
    require_extensions(pg_conn, "hstore", "citext", "ltree")
    _create(pg_conn)
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
    warned = [r for r in caplog.records if r.levelno == logging.WARNING
              and "'bx'" in r.getMessage() and "include.unknown.datatypes" in r.getMessage()]
    assert bool(warned) != modes.include_unknown, [r.getMessage() for r in caplog.records]
    ids = [1, 2, 3, 4]
    reference = {}
    for conv in ctx.converters:
        name = conv.bronze_field.name
        if name != "id":  # the reference encodings of the values as first inserted
            reference[name] = conv.to_bronze(texts[name]).to_pylist()
    bronze = DeltaTable(ctx.bronze_uri).to_pyarrow_table().to_pylist()
    snap = {r["after"]["id"]: r["after"] for r in bronze if r["op"] == "r"}
    streamed = {r["after"]["id"] - 1000: r["after"] for r in bronze if r["op"] == "c"}
    updates = {r["after"]["id"]: r for r in bronze if r["op"] == "u"}
    assert sorted(snap) == ids and sorted(streamed) == ids and sorted(updates) == [1, 4]
    assert ("bx" in snap[1]) == ("bx" in streamed[1]) == modes.include_unknown  # TYPE-12
    for name, want in reference.items():
        for i, k in enumerate(ids):
            expected = _norm(want[i])
            assert _norm(snap[k][name]) == expected, (mode, "snapshot", name, k)
            assert _norm(streamed[k][name]) == expected, (mode, "stream", name, k)
            if k in updates:  # REPLICA IDENTITY FULL: the whole old row, every type
                assert _norm(updates[k]["before"][name]) == expected, (mode, "before", name, k)
                if name != "i4":
                    assert _norm(updates[k]["after"][name]) == expected, (mode, "after", name)
    assert [updates[k]["after"]["i4"] for k in (1, 4)] == [42, 42]

    # Silver against PostgreSQL (not against the converters), read by delta-rs and by Spark,
    # for the snapshot rows (ids 1-4) and the streamed copies (ids 1001-1004).
    names = [n for n in reference if n != "i4"]
    expected = _pg_expected(pg_conn, modes, names)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT id, i4 FROM w ORDER BY id")
        pg_i4 = dict(cur.fetchall())
    for reader, silver in (("delta-rs", delta_rows(ctx.silver_uri, "id")),
                           ("spark", spark_rows(spark, ctx.silver_uri, "id"))):
        assert sorted(silver) == [*ids, *(k + 1000 for k in ids)], reader
        for k in (*ids, *(k + 1000 for k in ids)):
            assert silver[k]["i4"] == pg_i4[k], (reader, k)
        for name in names:
            for i, k in enumerate(ids):
                want = expected[name][i]
                assert _silver_form(name, silver[k][name], modes) == want, \
                    (mode, reader, "snapshot", name, k)
                assert _silver_form(name, silver[k + 1000][name], modes) == want, \
                    (mode, reader, "stream", name, k)
    assert live_rows(ctx.silver_uri).num_rows == 8
    assert table_uri(str(lakehouse), "silver", "public", "w") == ctx.silver_uri
