"""POINT and the PostGIS GEOMETRY / GEOGRAPHY types (seed-inventory §5.1, TYPE-01).

- POINT ``(x,y)`` -> STRUCT ``io.debezium.data.geometry.Point`` {x FLOAT64, y FLOAT64,
  wkb optional BYTES, srid optional INT32}; ``wkb`` is the 21-byte little-endian OGC WKB point
  Debezium builds, ``srid`` is null. Silver: ``struct<x double, y double>``.
- GEOMETRY / GEOGRAPHY: the text output is hex EWKB. Bronze STRUCT
  ``io.debezium.data.geometry.Geometry`` / ``...Geography`` {wkb BYTES, srid optional INT32}:
  ``wkb`` is the EWKB octets unchanged (Debezium's ``PostgisGeometry.fromHexEwkb``), ``srid``
  the SRID embedded in it, null when the EWKB carries no SRID flag (``parseSrid``; scalar
  and array elements alike). Silver: ``struct<wkb binary, srid int32>`` with the same octets
  (what ``ST_AsEWKB`` returns) and ``srid`` as PostgreSQL's ``ST_SRID`` gives it (0 when
  there is none).
- The other built-in geometric types (box, lseg, path, polygon, circle, line) are not in the
  seeds and follow ``include.unknown.datatypes`` (TYPE-26).
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.typeconv.base import BaseConverter, map_values
from pgcdc_dagster.cdc.typeconv.model import PgType, TypeModes
from pgcdc_dagster.cdc.typeconv.schema import ConnectSchema

POINT_SCHEMA = ConnectSchema(
    "struct", True, "io.debezium.data.geometry.Point", 1, "Geometry (POINT)",
    fields=(("x", ConnectSchema("float64", False)), ("y", ConnectSchema("float64", False)),
            ("wkb", ConnectSchema("bytes", True)), ("srid", ConnectSchema("int32", True))),
)
POINT_SILVER = pa.struct([pa.field("x", pa.float64(), False), pa.field("y", pa.float64(), False)])
GEO_SILVER = pa.struct([pa.field("wkb", pa.binary(), False), pa.field("srid", pa.int32())])
EWKB_SRID_FLAG = 0x20000000
EMPTY_GEOMETRYCOLLECTION = "010700000000000000"  # PostgisGeometry.createEmpty()


def geo_schema(geography: bool) -> ConnectSchema:
    """Debezium's Geometry / Geography struct schema."""
    kind = "Geography" if geography else "Geometry"
    return ConnectSchema(
        "struct", True, f"io.debezium.data.geometry.{kind}", 1, kind,
        fields=(("wkb", ConnectSchema("bytes", False)), ("srid", ConnectSchema("int32", True))),
    )


def parse_point(text: str) -> tuple[float, float]:
    """``(1.5,-2)`` -> (1.5, -2.0)."""
    x, y = text.strip().strip("()").split(",")
    return float(x), float(y)


def wkb_point(x: float, y: float) -> bytes:
    """Debezium's ``Point.buildWKBPoint``: byte order 1, type 1, x, y little-endian."""
    return struct.pack("<BIdd", 1, 1, x, y)


def ewkb_srid(ewkb: bytes) -> int | None:
    """SRID of an EWKB geometry, None when the SRID flag is not set (``parseSrid``)."""
    if len(ewkb) < 9:
        raise ValueError("Invalid EWKB length")
    order = "<" if ewkb[0] else ">"
    (geom_type,) = struct.unpack_from(order + "I", ewkb, 1)
    if geom_type & EWKB_SRID_FLAG:
        (srid,) = struct.unpack_from(order + "i", ewkb, 5)
        return int(srid)
    return None


class PointConverter(BaseConverter):
    """POINT -> io.debezium.data.geometry.Point; silver ``struct<x, y>``."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        super().__init__(column, pgtype, typmod, modes, nullable, POINT_SCHEMA, POINT_SILVER)

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        def value(v: str) -> dict[str, object]:
            x, y = parse_point(v)
            return {"x": x, "y": y, "wkb": wkb_point(x, y), "srid": None}
        return map_values(text, value, self.bronze_field.type)

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        return pa.StructArray.from_arrays(
            [pc.fill_null(pc.struct_field(values, "x"), 0.0),
             pc.fill_null(pc.struct_field(values, "y"), 0.0)],
            fields=list(POINT_SILVER), mask=pc.is_null(values))

    def _fallback_value(self) -> object:
        return {"x": 0.0, "y": 0.0, "wkb": wkb_point(0.0, 0.0), "srid": None}


class PostgisConverter(BaseConverter):
    """PostGIS geometry / geography -> Geometry / Geography {wkb, srid}."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        super().__init__(column, pgtype, typmod, modes, nullable,
                         geo_schema(pgtype.name == "geography"), GEO_SILVER)

    @staticmethod
    def _value(text: str) -> dict[str, object]:
        ewkb = bytes.fromhex(text)
        return {"wkb": ewkb, "srid": ewkb_srid(ewkb)}

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        return map_values(text, self._value, self.bronze_field.type)

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        """The EWKB unchanged; a missing SRID is PostgreSQL's ``ST_SRID`` value, 0."""
        values = values.cast(GEO_SILVER)
        return pa.StructArray.from_arrays(
            [pc.fill_null(pc.struct_field(values, "wkb"), b""),  # under the mask only
             pc.fill_null(pc.struct_field(values, "srid"), 0)],
            fields=list(GEO_SILVER), mask=pc.is_null(values))

    def bronze_placeholder(self) -> pa.Scalar | None:
        """Debezium has no geometry placeholder value; the envelope flags the column."""
        return None

    def _fallback_value(self) -> object:
        return self._value(EMPTY_GEOMETRYCOLLECTION)
