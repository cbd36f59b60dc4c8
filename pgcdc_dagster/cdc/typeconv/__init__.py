"""Column-at-a-time conversion of PostgreSQL text values to Debezium (bronze) and native (silver)
Arrow columns.

Usage::

    conv = converter_for("price", pgtype, typmod, TypeModes())
    bronze = conv.to_bronze(text_column)   # Debezium encoding, e.g. Decimal bytes
    silver = conv.to_silver(text_column)   # native, e.g. decimal128(10, 2)

See ``docs/types.md`` for the per-type table and seed-inventory §5 for the rules (TYPE-*).
"""

from __future__ import annotations

from pgcdc_dagster.cdc.typeconv.base import BaseConverter
from pgcdc_dagster.cdc.typeconv.model import ColumnConverter, PgType, TypeModes
from pgcdc_dagster.cdc.typeconv.registry import converter_for
from pgcdc_dagster.cdc.typeconv.schema import ConnectSchema

__all__ = [
    "BaseConverter",
    "ColumnConverter",
    "ConnectSchema",
    "PgType",
    "TypeModes",
    "converter_for",
]
