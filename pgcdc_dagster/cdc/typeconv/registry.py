"""``converter_for``: pick the converter of a column from its PostgreSQL type and the modes."""

from __future__ import annotations

import logging
from collections.abc import Callable

from pgcdc_dagster.cdc.typeconv import scalars, temporal
from pgcdc_dagster.cdc.typeconv.arrays import array_converter
from pgcdc_dagster.cdc.typeconv.base import BaseConverter, DroppedConverter
from pgcdc_dagster.cdc.typeconv.binary import BitsConverter, ByteaConverter, OpaqueConverter
from pgcdc_dagster.cdc.typeconv.geometric import PointConverter, PostgisConverter
from pgcdc_dagster.cdc.typeconv.hstore import HstoreConverter
from pgcdc_dagster.cdc.typeconv.interval import IntervalConverter
from pgcdc_dagster.cdc.typeconv.model import ColumnConverter, PgType, TypeModes
from pgcdc_dagster.cdc.typeconv.numeric import MoneyConverter, NumericConverter

log = logging.getLogger(__name__)

Factory = Callable[[str, PgType, int, TypeModes, bool], BaseConverter]

_BY_NAME: dict[str, Factory] = {
    "bool": scalars.BooleanConverter,
    "numeric": NumericConverter,
    "money": MoneyConverter,
    "bytea": ByteaConverter,
    "bit": BitsConverter,
    "varbit": BitsConverter,
    "interval": IntervalConverter,
    "hstore": HstoreConverter,
    "point": PointConverter,
    "geometry": PostgisConverter,
    "geography": PostgisConverter,
    "date": temporal.DateConverter,
    "time": temporal.TimeConverter,
    "timetz": temporal.TimeTzConverter,
    "timestamp": temporal.TimestampConverter,
    "timestamptz": temporal.TimestampTzConverter,
}
for _name in scalars.INTEGER_TYPES:
    _BY_NAME[_name] = scalars.IntegerConverter
for _name in scalars.FLOAT_TYPES:
    _BY_NAME[_name] = scalars.FloatConverter


def _string_factory(semantic: str | None) -> Factory:
    def build(column: str, pgtype: PgType, typmod: int, modes: TypeModes,
              nullable: bool) -> BaseConverter:
        return scalars.StringConverter(column, pgtype, typmod, modes, nullable, semantic)
    return build


for _name, _semantic in scalars.STRING_TYPES.items():
    _BY_NAME[_name] = _string_factory(_semantic)


def register(name: str, factory: Factory) -> None:
    """Register (or replace) the converter factory of a type name."""
    _BY_NAME[name] = factory


def converter_for(column_name: str, pgtype: PgType, typmod: int, modes: TypeModes, *,
                  nullable: bool = True, dimensions: int = 1) -> ColumnConverter:
    """The converter of one column.

    Domains convert as their base type; a domain over a built-in type that declares a
    length/scale passes that typmod on (TYPE-11: a domain over another domain does not).

    Args:
        column_name: The column name (the field name in events).
        pgtype: The column type, as ``postgres.catalog.load_types`` returns it.
        typmod: The column's ``atttypmod`` (-1 when absent).
        modes: The Debezium handling modes.
        nullable: False for NOT NULL columns (the Connect schema is then required).
        dimensions: Declared array dimensions (``attndims``; see ``arrays.py``).

    Returns:
        A converter; its ``dropped`` is True for a type Debezium omits (unknown type with
        ``include.unknown.datatypes`` false, TYPE-12).

    Raises:
        UnsupportedTypeError: never for unknown types (they are dropped or kept opaque);
            raised by ``to_bronze`` for values a mode cannot represent.
    """
    return _build(column_name, pgtype, typmod, modes, nullable, dimensions)


def _build(column: str, pgtype: PgType, typmod: int, modes: TypeModes,
           nullable: bool, dimensions: int = 1) -> BaseConverter:
    if pgtype.typtype == "d" and pgtype.base is not None:
        base = pgtype.base
        typmod = _domain_typmod(pgtype, typmod)
        while base.typtype == "d" and base.base is not None:
            base = base.base
        return _build(column, base, typmod, modes, nullable, dimensions)
    if pgtype.is_array:
        conv = array_converter(column, pgtype, typmod, modes, nullable, _build, dimensions)
        if conv.dropped:
            return _unknown(column, pgtype, typmod, modes, nullable)
        return conv
    factory = _BY_NAME.get(pgtype.name) if pgtype.schema == "pg_catalog" or \
        pgtype.typtype == "b" else None
    if factory is not None:
        return factory(column, pgtype, typmod, modes, nullable)
    if pgtype.typtype == "e":
        return scalars.enum_converter(column, pgtype, typmod, modes, nullable)
    return _unknown(column, pgtype, typmod, modes, nullable)


def _domain_typmod(domain: PgType, typmod: int) -> int:
    """TYPE-11: a domain over a built-in type passes its declared length/scale on; a domain
    over another domain does not (the driver's column metadata lacks it)."""
    if typmod >= 0:
        return typmod
    assert domain.base is not None
    if domain.base.typtype == "d":
        return -1
    return domain.base_typmod


def _unknown(column: str, pgtype: PgType, typmod: int, modes: TypeModes,
             nullable: bool) -> BaseConverter:
    if modes.include_unknown:
        return OpaqueConverter(column, pgtype, typmod, modes, nullable)
    log.warning(
        "column %r has type %s, which has no Debezium mapping; it is left out of events "
        "(set include.unknown.datatypes=true to keep it as opaque bytes)",
        column, pgtype.qualified_name)
    return DroppedConverter(column, pgtype, typmod, modes, nullable)
