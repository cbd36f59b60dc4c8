"""Arrays of more element types captured end to end, by snapshot and by stream (TYPE-25).

Element encodings are the scalar ones of the seeds (seed-inventory §5.1): network types,
ranges, XML and JSON as STRING (TYPE-02; ``io.debezium.data.Xml`` / ``Json``), BIT(1) as
BOOLEAN and BIT(n) / BIT VARYING as little-endian ``io.debezium.data.Bits`` bytes (BIT(n)
sized n/8 rounded up, BIT VARYING by content), TIMETZ as ``io.debezium.time.ZonedTime`` in
GMT (TYPE-07), OID as INT64, SMALLINT as INT16, REAL as FLOAT32, POINT as
``io.debezium.data.geometry.Point`` {x, y, wkb, srid}. The expected bronze values are built
here from PostgreSQL's own element values and those rules (never from the converters);
silver is compared with PostgreSQL's values (text output per element for the string forms),
read back by delta-rs and by Spark. Edge values: NULL arrays, empty arrays, NULL elements,
min/max, NaN/Infinity, non-ASCII text.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from pgcdc_dagster.cdc.typeconv import TypeModes
from tests.support.capture_both import STREAM_OFFSET, capture_both
from tests.support.pg_expect import delta_rows, norm, spark_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# name: (DDL, three rows of SQL literals); a fourth row is all NULL.
COLUMNS: dict[str, tuple[str, tuple[str, str, str]]] = {
    "ine": ("inet[]", ("'{192.168.1.5/24,NULL,::1}'", "'{}'",
                       "'{10.0.0.1,2001:db8::ff00:42:8329/64}'")),
    "cid": ("cidr[]", ("'{10.0.0.0/8,NULL}'", "'{}'", "'{0.0.0.0/0,2001:db8::/32}'")),
    "mac": ("macaddr[]", ("'{08:00:2b:01:02:03,NULL}'", "'{}'",
                          "'{ff:ff:ff:ff:ff:ff,00:00:00:00:00:00}'")),
    "r4": ("int4range[]", ("ARRAY['[1,3)'::int4range, NULL, 'empty']", "'{}'",
                           "ARRAY['(,5]'::int4range, '[-2147483648,2147483647)']")),
    "tzr": ("tstzrange[]", ("ARRAY['[2018-06-20 15:13:16+02,2018-06-21 00:00:00+00)'"
                            "::tstzrange, NULL]", "'{}'",
                            "ARRAY['[-infinity,)'::tstzrange, 'empty']")),
    "x": ("xml[]", ("ARRAY['<a>1</a>'::xml, NULL]", "'{}'", "ARRAY['<c>ä, \"q\"</c>'::xml]")),
    "b1": ("bit[]", ("'{1,NULL,0}'", "'{}'", "'{0}'")),
    "b": ("bit(3)[]", ("'{101,NULL,000}'", "'{}'", "'{111,100}'")),
    "vb": ("varbit[]", ("'{101,NULL,\"\"}'", "'{}'", "'{0001,10000000000000000}'")),
    "ttz": ("timetz[]", ("'{09:43:16.945104+05,NULL}'", "'{}'",
                         "'{24:00:00+00,00:00:00-12,23:59:59.5+00}'")),
    "js": ("json[]", ("ARRAY['{\"a\": [1, null]}'::json, NULL, '\"ü\"']", "'{}'",
                      "ARRAY['[]'::json, 'null']")),
    "oi": ("oid[]", ("'{0,NULL,4294967295}'", "'{}'", "'{1}'")),
    "i2": ("smallint[]", ("'{-32768,NULL,32767}'", "'{}'", "'{0}'")),
    "f4": ("real[]", ("'{1.5,NULL,-Infinity,NaN}'", "'{}'", "'{3.4028235e38,1.17549435e-38}'")),
    "pt": ("point[]", ("ARRAY['(1,2)'::point, NULL]", "'{}'",
                       "ARRAY['(-1.5,0)'::point, '(1e-10,1e10)']")),
}


def _per_element(c: str, expr: str) -> str:
    """SQL: ``expr`` (over element ``x``) for every element of array ``c``, order and NULLs
    kept; NULL for a NULL array."""
    return (f"CASE WHEN {c} IS NULL THEN NULL ELSE ARRAY(SELECT {expr} "
            f"FROM unnest({c}) WITH ORDINALITY u(x, o) ORDER BY o) END")


def _bits(text: str, width: int | None) -> bytes:
    """Bits are little-endian bytes sized by content, BIT(n) too (as Debezium 3.6 writes
    them; ``width`` is the declared n, which no longer pads)."""
    value = int(text, 2) if text else 0
    return value.to_bytes((value.bit_length() + 7) // 8, "little")


def _point(text: str) -> dict[str, Any]:
    """Debezium's Point: {x, y, wkb = little-endian OGC WKB point, srid = null}."""
    x, y = map(float, text.split())
    return {"x": x, "y": y, "wkb": struct.pack("<BIdd", 1, 1, x, y), "srid": None}


def _utc_time(c: str) -> str:
    return _per_element(c, "CASE WHEN x::text = '24:00:00+00' THEN '00:00:00Z' "
                           "ELSE replace((x AT TIME ZONE 'UTC')::text, '+00', 'Z') END")


def _same(v: Any) -> Any:
    return v


# name: (SQL giving PostgreSQL's element values, bronze element from it, silver element)
EXPECT: dict[str, tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = {
    # array_to_json writes each element's text output (inet's ::text would add the mask)
    "ine": ("array_to_json({c})::text", _same, _same),
    "cid": ("{c}::text[]", _same, _same),
    "mac": ("{c}::text[]", _same, _same),
    "r4": ("{c}::text[]", _same, _same),
    "tzr": ("{c}::text[]", _same, _same),
    "x": ("{c}::text[]", _same, _same),
    "b1": ("{c}::text[]", lambda t: t == "1", lambda t: t == "1"),
    "b": ("{c}::text[]", lambda t: _bits(t, 3), _same),
    "vb": ("{c}::text[]", lambda t: _bits(t, None), lambda t: t.lstrip("0")),
    "ttz": (_utc_time("{c}"), _same, _same),
    "js": ("{c}::text[]", _same, _same),
    "oi": ("{c}::bigint[]", _same, _same),
    "i2": ("{c}", _same, _same),
    "f4": ("{c}::float8[]", _same, _same),  # exact float32 values, widened
    "pt": (_per_element("{c}", "x[0]::text || ' ' || x[1]::text"), _point,
           lambda xy: dict(zip("xy", map(float, xy.split()), strict=True))),
}
SEMANTIC = {"b": ("io.debezium.data.Bits", {"length": "3"}),
            "vb": ("io.debezium.data.Bits", {"length": "2147483647"}),
            "ttz": ("io.debezium.time.ZonedTime", None), "x": ("io.debezium.data.Xml", None),
            "js": ("io.debezium.data.Json", None),
            "pt": ("io.debezium.data.geometry.Point", None)}
LITERAL = {"ine": pa.string(), "b1": pa.bool_(), "b": pa.binary(), "oi": pa.int64(),
           "i2": pa.int16(), "f4": pa.float32(), "r4": pa.string(), "tzr": pa.string(),
           "ttz": pa.string(), "x": pa.string(), "js": pa.string(), "vb": pa.binary()}
"""The bronze (Delta) type of the elements: the Debezium literal type's storage."""


def _pg_values(conn) -> dict[str, list[Any]]:
    with conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'")  # the capture sessions' setting
        exprs = ", ".join(EXPECT[n][0].format(c=n) for n in COLUMNS)
        cur.execute(f"SELECT {exprs} FROM arr WHERE id < {STREAM_OFFSET} ORDER BY id")
        rows = cur.fetchall()
    out = {}
    for i, name in enumerate(COLUMNS):
        vals = [r[i] for r in rows]
        out[name] = [json.loads(v) if isinstance(v, str) else v for v in vals]
    return out


def _map(values: list[Any] | None, fn: Callable[[Any], Any]) -> Any:
    return None if values is None else [None if v is None else fn(v) for v in values]


def test_more_arrays_by_snapshot_and_stream(pg_dsn, pg_conn, spark, lakehouse):
    """TYPE-25 arrays of inet, cidr, macaddr, int4range, tstzrange, xml, bit, bit(n),
    varbit, timetz, json, oid, smallint, real and point (TYPE-02, TYPE-07, §5.1)."""
    with pg_conn.cursor() as cur:
        cols = ", ".join(f"{n} {ddl}" for n, (ddl, _) in COLUMNS.items())
        cur.execute(f"CREATE TABLE arr (id int PRIMARY KEY, {cols})")
        for row in range(3):
            values = ", ".join(lits[row] for _, lits in COLUMNS.values())
            cur.execute(f"INSERT INTO arr (id, {', '.join(COLUMNS)}) VALUES ({row + 1}, "
                        f"{values})")
        cur.execute("INSERT INTO arr (id) VALUES (4)")
    cap = capture_both(pg_dsn, pg_conn, spark, lakehouse, "arr", TypeModes(), slot="arr")
    pg = _pg_values(pg_conn)
    assert pg["ine"][0] == ["192.168.1.5/24", None, "::1"]  # element text output, no /128

    schemas = {c.bronze_field.name: c.connect_schema() for c in cap.ctx.converters}
    fields = {c.bronze_field.name: c.bronze_field for c in cap.ctx.converters}
    for name in COLUMNS:
        assert schemas[name]["type"] == "array", name
        items = schemas[name]["items"]
        assert items["optional"] is True, name  # NULL elements are allowed
        if name in SEMANTIC:
            semantic, params = SEMANTIC[name]
            assert items["name"] == semantic, name
            if params is not None:
                assert items["parameters"] == params, name
        if name in LITERAL:
            assert fields[name].type.value_type == LITERAL[name], name

    ids = [1, 2, 3, 4]
    for name, (_, bronze_fn, _) in EXPECT.items():
        for i, k in enumerate(ids):
            want = norm(_map(pg[name][i], bronze_fn))
            for how, images in cap.images:
                assert norm(images[k][name]) == want, (how, name, k)

    for reader, silver in (("delta-rs", delta_rows(cap.ctx.silver_uri, "id")),
                           ("spark", spark_rows(spark, cap.ctx.silver_uri, "id"))):
        assert sorted(silver) == [*ids, *(k + STREAM_OFFSET for k in ids)], reader
        for name, (_, _, silver_fn) in EXPECT.items():
            for i, k in enumerate(ids):
                want = norm(_map(pg[name][i], silver_fn))
                assert norm(silver[k][name]) == want, (reader, "snapshot", name, k)
                assert norm(silver[k + STREAM_OFFSET][name]) == want, \
                    (reader, "stream", name, k)
