"""PostGIS geometry / geography captured end to end, by snapshot and by stream (TYPE-01).

Bronze holds Debezium's ``io.debezium.data.geometry.Geometry`` / ``Geography`` struct
``{wkb, srid}``. Debezium's ``PostgisGeometry`` keeps PostgreSQL's EWKB in ``wkb`` ("since
EWKB is a superset of WKB, we use EWKB here") and reads ``srid`` from it (null when the EWKB
has no SRID flag), so the expected values are PostgreSQL's own ``ST_AsEWKB`` / ``ST_SRID``
(bronze: null where ``ST_SRID`` is 0; silver: ``ST_SRID`` itself). For a 2-D geometry
without SRID the EWKB is exactly ``ST_AsBinary``, which the test checks too; for the others
PostgreSQL parses the captured bytes back and ``ST_AsBinary`` of the result equals
``ST_AsBinary`` of the source value. Silver holds the same struct and is compared with
PostgreSQL in the same way, read back by delta-rs and by Spark.
"""

from __future__ import annotations

import psycopg2
import pytest

from pgcdc_dagster.cdc.typeconv import TypeModes
from tests.support.capture_both import STREAM_OFFSET, capture_both
from tests.support.extensions import require_extensions
from tests.support.pg_expect import delta_rows, spark_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROWS = [
    # (geometry, geometry(Point,4326), geography)
    ("'POINT(1 2)'", "'SRID=4326;POINT(-71.06 42.36)'", "'POINT(-71.06 42.36)'"),
    ("'SRID=3857;POLYGON((0 0,1 0,1 1,0 0))'", "NULL", "'SRID=4326;LINESTRING(0 0,1 1)'"),
    ("'GEOMETRYCOLLECTION EMPTY'", "'SRID=4326;POINT(0 0)'", "'POLYGON((0 0,1 0,1 1,0 0))'"),
    ("'SRID=4326;POINT Z (1 2 3)'", "'SRID=4326;POINT(180 -90)'", "NULL"),
    ("'MULTILINESTRING((0 0,1 1),(2 2,3 3))'", "'SRID=4326;POINT(-0.5 1e-9)'",
     "'MULTIPOINT((1 2),(3 4))'"),
    ("NULL", "NULL", "NULL"),
]
COLUMNS = {"g": "geometry", "gp": "geometry(Point,4326)", "gg": "geography"}


def _create(conn) -> None:
    require_extensions(conn, "postgis")
    with conn.cursor() as cur:
        cols = ", ".join(f"{n} {ddl}" for n, ddl in COLUMNS.items())
        cur.execute(f"CREATE TABLE geo (id int PRIMARY KEY, {cols}, ga geometry[])")
        for i, row in enumerate(ROWS, start=1):
            cur.execute(f"INSERT INTO geo (id, g, gp, gg, ga) VALUES ({i}, {', '.join(row)}, "
                        f"CASE WHEN {row[0]} IS NULL THEN NULL "
                        f"ELSE ARRAY[({row[0]})::geometry, NULL] END)")


def _expected(conn, column: str, *, bronze: bool = False) -> dict[int, dict | None]:
    """PostgreSQL's ``{wkb: ST_AsEWKB, srid: ST_SRID}`` of each source row (for bronze, a
    0 SRID is null: the EWKB carries no SRID flag)."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT id, ST_AsEWKB({column}::geometry), ST_SRID({column}) FROM geo "
                    f"WHERE id < {STREAM_OFFSET} ORDER BY id")
        return {i: None if e is None else {"wkb": bytes(e), "srid": (s or None) if bronze else s}
                for i, e, s in cur.fetchall()}


def _round_trip_wkb(conn, wkb: bytes) -> bytes:
    with conn.cursor() as cur:
        cur.execute("SELECT ST_AsBinary(ST_GeomFromEWKB(%s))", (psycopg2.Binary(wkb),))
        return bytes(cur.fetchone()[0])


def test_postgis_by_snapshot_and_stream(pg_dsn, pg_conn, spark, lakehouse):
    """TYPE-01: Geometry / Geography structs through the snapshot (text COPY, hex EWKB) and
    the stream (pgoutput text), bronze and silver equal to PostgreSQL's EWKB and SRID."""
    _create(pg_conn)
    cap = capture_both(pg_dsn, pg_conn, spark, lakehouse, "geo", TypeModes(), slot="geo")
    schemas = {c.bronze_field.name: c.connect_schema() for c in cap.ctx.converters}
    assert schemas["g"]["name"] == "io.debezium.data.geometry.Geometry"
    assert schemas["gp"]["name"] == "io.debezium.data.geometry.Geometry"
    assert schemas["gg"]["name"] == "io.debezium.data.geometry.Geography"
    assert [f["field"] for f in schemas["g"]["fields"]] == ["wkb", "srid"]
    ids = range(1, len(ROWS) + 1)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT id, ST_AsBinary(g::geometry), ST_AsBinary(gp), "
                    "ST_AsBinary(gg::geometry) FROM geo WHERE id < 1000 ORDER BY id")
        as_binary = {r[0]: dict(zip(("g", "gp", "gg"), r[1:], strict=True))
                     for r in cur.fetchall()}
    for column in COLUMNS:
        want = _expected(pg_conn, column, bronze=True)
        for how, images in cap.images:
            for i in ids:
                got = images[i][column]
                assert got == want[i], (how, column, i)
                if got is None:
                    continue
                # the captured bytes are the geometry PostgreSQL holds (OGC WKB equal)
                assert _round_trip_wkb(pg_conn, got["wkb"]) == bytes(as_binary[i][column])
        plain = want[1] if column == "g" else None  # POINT(1 2): 2-D, no SRID
        if plain is not None:
            assert plain["wkb"] == bytes(as_binary[1]["g"]) and plain["srid"] is None
    # the geometry[] column: elements are the same structs, NULL elements kept
    g = _expected(pg_conn, "g", bronze=True)
    for how, images in cap.images:
        for i in ids:
            assert images[i]["ga"] == (None if g[i] is None else [g[i], None]), (how, i)

    for reader, silver in (("delta-rs", delta_rows(cap.ctx.silver_uri, "id")),
                           ("spark", spark_rows(spark, cap.ctx.silver_uri, "id"))):
        assert sorted(silver) == [*ids, *(i + STREAM_OFFSET for i in ids)], reader
        for column in COLUMNS:
            want = _expected(pg_conn, column)
            for i in ids:
                for k in (i, i + STREAM_OFFSET):
                    got = silver[k][column]
                    if got is not None:
                        got = {"wkb": bytes(got["wkb"]), "srid": got["srid"]}
                    assert got == want[i], (reader, column, k)
