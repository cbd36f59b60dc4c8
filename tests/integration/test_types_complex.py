"""Arrays, enums, domains, extension types (hstore, citext, ltree, PostGIS) and unknown types
against a real PostgreSQL: bronze per the seeds, silver equal to the PostgreSQL value.

IDs: seed-inventory.md TYPE-01, TYPE-09, TYPE-11, TYPE-12, TYPE-25, TYPE-26.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from pgcdc_dagster.cdc.typeconv import TypeModes
from tests.integration.test_types_support import make_case
from tests.support.extensions import require_extensions

pytestmark = pytest.mark.integration


def _flat(value):
    if isinstance(value, list):
        return [x for v in value for x in _flat(v)] if any(isinstance(v, list) for v in value) \
            else value
    return value


def test_int_arrays_nulls_empty_multidim(pg_conn):
    lits = ["'{1,NULL,3}'", "'{}'", "NULL", "'{{1,2},{3,4}}'", "'[0:1]={7,8}'",
            "ARRAY[-2147483648, 2147483647]"]
    case = make_case(pg_conn, "int[]", lits)
    assert case.bronze() == [None if v is None else _flat(v) for v in case.py]
    assert case.conv.connect_schema()["items"] == {"type": "int32", "optional": True}
    grid = make_case(pg_conn, "int[][]", ["'{{1,2},{3,NULL}}'", "'{}'", "'{{5}}'"])
    assert grid.silver() == grid.py  # declared two dimensions: nested lists
    assert grid.bronze() == grid.py


def test_text_arrays_with_quoting(pg_conn):
    lits = ["ARRAY['a b', NULL, 'NULL', 'q\"x', 'c,d', '{}', '日本', '', 'back\\slash']",
            "ARRAY[]::text[]", "NULL"]
    for ddl in ("text[]", "varchar(20)[]", "citext[]"):
        with pg_conn.cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS citext")
        case = make_case(pg_conn, ddl, lits)
        if ddl == "citext[]":
            assert case.silver() == case.sql("c::text[]")
        else:
            assert case.silver() == case.py
        assert case.bronze() == case.silver()


def test_numeric_and_temporal_arrays(pg_conn):
    dec = make_case(pg_conn, "numeric(5,2)[]", ["'{1.50,-999.99,NULL}'", "'{}'"])
    assert dec.bronze() == [[b"\x00\x96", (-99999).to_bytes(3, "big", signed=True), None], []]
    assert dec.silver() == dec.py
    var = make_case(pg_conn, "numeric[]", ["'{1.50,100,NULL}'"])
    assert var.bronze() == [[{"scale": 1, "value": b"\x0f"}, {"scale": 0, "value": b"\x64"}, None]]
    assert [[None if x is None else Decimal(x) for x in row] for row in var.silver()] == var.py
    ts = make_case(pg_conn, "timestamptz[]", ["ARRAY['2018-06-20 15:13:16.945104+00'::timestamptz,"
                                            " NULL]"])
    assert ts.bronze() == [["2018-06-20T15:13:16.945104Z", None]]
    assert ts.silver() == ts.py
    d = make_case(pg_conn, "date[]", ["'{2018-06-20,NULL,1970-01-01}'"])
    assert d.bronze() == [[17702, None, 0]] and d.silver() == d.py
    t = make_case(pg_conn, "time(3)[]", ["'{15:13:16.945}'"])
    assert t.bronze() == [[54796945]] and t.silver() == [["15:13:16.945"]]
    iv = make_case(pg_conn, "interval[]", ["ARRAY['1 year 2 mons 3 days 04:05:06.78'::interval]"],
                   TypeModes(interval="string"))
    assert iv.bronze() == [["P1Y2M3DT4H5M6.78S"]]


@pytest.mark.parametrize(("ddl", "lits"), [
    ("boolean[]", ["'{t,f,NULL}'"]),
    ("bigint[]", ["'{-9223372036854775808,9223372036854775807}'"]),
    ("double precision[]", ["'{1.5,-0.25,NULL}'"]),
    ("uuid[]", ["'{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}'"]),
    ("char(3)[]", ["'{ab,NULL}'"]),
])
def test_simple_arrays(pg_conn, ddl, lits):
    case = make_case(pg_conn, ddl, [*lits, "NULL"])
    py = case.sql("c::text[]") if ddl == "uuid[]" else case.py
    assert case.silver() == py
    assert case.bronze() == py


def test_json_bytea_money_point_arrays(pg_conn):
    js = make_case(pg_conn, "jsonb[]", ["ARRAY['{\"a\": 1}'::jsonb, NULL, '[1, \"x\"]']"])
    assert [[None if x is None else json.loads(x) for x in row] for row in js.silver()] == [
        [{"a": 1}, None, [1, "x"]]]
    assert js.conv.connect_schema()["items"]["name"] == "io.debezium.data.Json"
    by = make_case(pg_conn, "bytea[]", ["ARRAY['\\x00ff'::bytea, NULL, '\\x'::bytea]"])
    assert by.bronze() == [[b"\x00\xff", None, b""]]
    b64 = make_case(pg_conn, "bytea[]", ["ARRAY['\\x00ff'::bytea]"], TypeModes(binary="base64"))
    assert b64.bronze() == [["AP8="]]
    money = make_case(pg_conn, "money[]", ["ARRAY['1.5'::money, '-2'::money]"])
    assert money.silver() == [[Decimal("1.50"), Decimal("-2.00")]]
    pt = make_case(pg_conn, "point[]", ["ARRAY[point(1,2), NULL]"])
    assert [[None if p is None else (p["x"], p["y"]) for p in row]
            for row in pt.bronze()] == [[(1.0, 2.0), None]]


def test_enum_and_enum_array(pg_conn):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'héllo wörld')")
    case = make_case(pg_conn, "mood", ["'sad'", "'héllo wörld'", "NULL"])
    assert case.bronze() == case.py == case.silver()
    schema = case.conv.connect_schema()
    assert schema["name"] == "io.debezium.data.Enum"
    assert schema["parameters"] == {"allowed": "sad,ok,héllo wörld"}
    arr = make_case(pg_conn, "mood[]", ["'{sad,NULL,ok}'", "'{}'"])
    assert arr.bronze() == [["sad", None, "ok"], []]
    assert arr.conv.connect_schema()["items"]["parameters"] == {"allowed": "sad,ok,héllo wörld"}


def test_domains_follow_their_base_type(pg_conn):
    """TYPE-11: a domain over a built-in inherits length/scale; over a domain it does not."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE DOMAIN price AS numeric(10,2) CHECK (VALUE >= 0)")
        cur.execute("CREATE DOMAIN price2 AS price")
        cur.execute("CREATE DOMAIN code AS varchar(5)")
        cur.execute("CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
    p = make_case(pg_conn, "price", ["12.34", "NULL"])
    assert p.bronze() == [b"\x04\xd2", None]
    assert p.conv.connect_schema()["parameters"] == {
        "scale": "2", "connect.decimal.precision": "10"}
    assert p.silver() == p.py
    p2 = make_case(pg_conn, "price2", ["12.30"])
    assert p2.bronze() == [{"scale": 1, "value": b"\x7b"}]
    assert make_case(pg_conn, "code", ["'abc'"]).bronze() == ["abc"]
    pi = make_case(pg_conn, "posint", ["7"])
    assert pi.bronze() == [7] and pi.conv.bronze_field.type.bit_width == 32
    arr = make_case(pg_conn, "price[]", ["ARRAY[1.5::price, NULL]"])
    assert arr.silver() == [[Decimal("1.50"), None]]


def test_hstore_modes(pg_conn):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS hstore")
    lits = ["'\"a\"=>\"1\", \"b\"=>NULL, \"ключ\"=>\"знач\", \"q\\\"x\"=>\"\\\\\"'", "''", "NULL",
            "hstore(ARRAY(SELECT 'k' || i FROM generate_series(1, 20) i),"
            " ARRAY(SELECT 'v' || i FROM generate_series(1, 20) i))"]
    case = make_case(pg_conn, "hstore", lits)
    as_json = case.sql("hstore_to_json(c)")
    assert [None if v is None else json.loads(v) for v in case.bronze()] == as_json
    assert case.bronze()[1] == "{}"
    assert case.conv.connect_schema()["name"] == "io.debezium.data.Json"
    assert [None if v is None else dict(v) for v in case.silver()] == as_json
    m = make_case(pg_conn, "hstore", lits, TypeModes(hstore="map"))
    assert [None if v is None else dict(v) for v in m.bronze()] == as_json
    assert m.conv.connect_schema()["type"] == "map"
    arr = make_case(pg_conn, "hstore[]", ["ARRAY['a=>1'::hstore, NULL]"], TypeModes(hstore="map"))
    assert arr.bronze() == [[[("a", "1")], None]]


def test_ltree_citext(pg_conn):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS ltree")
        cur.execute("CREATE EXTENSION IF NOT EXISTS citext")
    lt = make_case(pg_conn, "ltree", ["'Top.Science.Astronomy'", "''", "NULL"])
    assert lt.bronze() == lt.py == lt.silver()
    assert lt.conv.connect_schema()["name"] == "io.debezium.data.Ltree"
    ci = make_case(pg_conn, "citext", ["'MiXeD Ünïcode'", "NULL"])
    assert ci.bronze() == ci.py and "name" not in ci.conv.connect_schema()
    lta = make_case(pg_conn, "ltree[]", ["'{a.b,c}'"])
    assert lta.bronze() == [["a.b", "c"]]


def _postgis(conn) -> None:
    require_extensions(conn, "postgis")


@pytest.mark.parametrize("ddl", ["geometry", "geometry(Point,4326)", "geography"])
def test_postgis(pg_conn, ddl):
    """TYPE-01: Geometry/Geography {wkb (EWKB), srid}."""
    _postgis(pg_conn)
    lits = {
        "geometry": ["'POINT(1 2)'", "'SRID=3857;POLYGON((0 0,1 0,1 1,0 0))'",
                     "'GEOMETRYCOLLECTION EMPTY'", "'SRID=4326;POINT Z (1 2 3)'",
                     "'MULTILINESTRING((0 0,1 1),(2 2,3 3))'", "NULL"],
        "geometry(Point,4326)": ["'SRID=4326;POINT(-71.06 42.36)'", "NULL"],
        "geography": ["'POINT(-71.06 42.36)'", "'SRID=4326;LINESTRING(0 0,1 1)'", "NULL"],
    }[ddl]
    case = make_case(pg_conn, ddl, lits)
    ewkb = case.sql("ST_AsEWKB(c::geometry)")
    srid = case.sql("ST_SRID(c)")
    want = [None if e is None else {"wkb": bytes(e), "srid": s}
            for e, s in zip(ewkb, srid, strict=True)]
    # bronze: Debezium's parseSrid gives null without the EWKB SRID flag; silver: ST_SRID
    assert case.bronze() == [None if w is None else {**w, "srid": w["srid"] or None}
                             for w in want]
    assert case.silver() == want
    name = "Geography" if ddl == "geography" else "Geometry"
    assert case.conv.connect_schema()["name"] == f"io.debezium.data.geometry.{name}"
    arr = make_case(pg_conn, "geometry[]", ["ARRAY['POINT(1 2)'::geometry, NULL]"])
    assert arr.bronze()[0][1] is None and arr.bronze()[0][0]["srid"] is None


def test_unknown_types_dropped_or_opaque(pg_conn):
    """TYPE-12/TYPE-26: unknown types are left out, or kept as the octets of their text."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TYPE floatrange AS RANGE (subtype = float8)")
        cur.execute("CREATE TYPE pair AS (a int, b text)")
    for ddl, lit in (("box", "'((1,1),(0,0))'"), ("tsvector", "'a fat cat'"),
                     ("floatrange", "'[1.5,2.5)'"), ("pair", "ROW(1, 'x')"),
                     ("box[]", "ARRAY['((1,1),(0,0))'::box]")):
        dropped = make_case(pg_conn, ddl, [lit, "NULL"])
        assert dropped.conv.dropped is True
        opaque = make_case(pg_conn, ddl, [lit, "NULL"], TypeModes(include_unknown=True))
        assert opaque.conv.dropped is False
        if ddl == "box[]":  # array of an unknown element: array of opaque elements
            assert opaque.bronze() == [[b"(1,1),(0,0)"], None]
            continue
        assert opaque.bronze() == [opaque.texts[0].encode(), None]
        assert opaque.silver() == opaque.texts
        hexed = make_case(pg_conn, ddl, [lit], TypeModes(include_unknown=True, binary="hex"))
        assert hexed.bronze() == [hexed.texts[0].encode().hex()]
