"""Booleans, integers, floats and the types Debezium carries as plain or named STRING values.

Seeds: 001/002 "Data Types" table, listed as seed-inventory §5.1.
- BOOLEAN -> BOOLEAN; BIT(1) -> BOOLEAN (see ``binary.py``).
- SMALLINT -> INT16, INTEGER -> INT32, BIGINT -> INT64, OID -> INT64 (Red Hat table).
- REAL -> FLOAT32, DOUBLE PRECISION -> FLOAT64 (NaN and infinities kept).
- CHAR/VARCHAR/TEXT/CITEXT/INET/CIDR/MACADDR/MACADDR8/range types/ISBN (isn extension) ->
  STRING without a name;
  JSON/JSONB -> ``io.debezium.data.Json``, XML -> ``io.debezium.data.Xml``, UUID ->
  ``io.debezium.data.Uuid``, LTREE -> ``io.debezium.data.Ltree``, ENUM ->
  ``io.debezium.data.Enum`` with parameter ``allowed`` (comma-joined labels).

Silver keeps the same value natively: bool, int16/32/64, float32/64, and the text form as
``string`` for the string types (JSON text as PostgreSQL prints it; ``char(n)`` keeps its
padding, as PostgreSQL's output does).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.typeconv.base import BaseConverter
from pgcdc_dagster.cdc.typeconv.model import PgType, TypeModes
from pgcdc_dagster.cdc.typeconv.schema import primitive

INTEGER_TYPES: dict[str, tuple[str, pa.DataType]] = {
    "int2": ("int16", pa.int16()),
    "int4": ("int32", pa.int32()),
    "int8": ("int64", pa.int64()),
    "oid": ("int64", pa.int64()),
    "xid": ("int64", pa.int64()),
    "cid": ("int64", pa.int64()),
    "regclass": ("int64", pa.int64()),
    "regtype": ("int64", pa.int64()),
    "regproc": ("int64", pa.int64()),
}

FLOAT_TYPES: dict[str, tuple[str, pa.DataType]] = {
    "float4": ("float32", pa.float32()),
    "float8": ("float64", pa.float64()),
}

# PostgreSQL type name -> Debezium semantic name (None: plain STRING).
STRING_TYPES: dict[str, str | None] = {
    "text": None,
    "varchar": None,
    "bpchar": None,
    "char": None,
    "name": None,
    "citext": None,
    "inet": None,
    "cidr": None,
    "macaddr": None,
    "macaddr8": None,
    "int4range": None,
    "int8range": None,
    "numrange": None,
    "tsrange": None,
    "tstzrange": None,
    "daterange": None,
    "json": "io.debezium.data.Json",
    "jsonb": "io.debezium.data.Json",
    "xml": "io.debezium.data.Xml",
    "uuid": "io.debezium.data.Uuid",
    "ltree": "io.debezium.data.Ltree",
    # The isn extension's ISBN: a plain STRING of its text output (Debezium's
    # PostgresValueConverter maps the ``isbn`` oid to a string; the other isn types are
    # unknown to it and follow include.unknown.datatypes).
    "isbn": None,
}

# Array types whose unchanged-TOAST placeholder Debezium emits as [placeholder]
# (UnchangedToastedReplicationMessageColumn: _text, _varchar, _json, _jsonb).
TEXT_ARRAY_PLACEHOLDER_ELEMENTS = frozenset({"text", "varchar", "json", "jsonb"})

# Fixed-width types: never TOASTed, so no placeholder.
_FIXED_WIDTH = frozenset({"uuid", "macaddr", "macaddr8", "char", "isbn"})


class BooleanConverter(BaseConverter):
    """BOOLEAN -> BOOLEAN. Text output ``t`` / ``f``."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        super().__init__(column, pgtype, typmod, modes, nullable, primitive("boolean"),
                         pa.bool_())

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        return pc.equal(text, "t")

    def _silver(self, text: pa.StringArray) -> pa.Array:
        return pc.equal(text, "t")


class IntegerConverter(BaseConverter):
    """SMALLINT -> INT16, INTEGER -> INT32, BIGINT and OID -> INT64 (vectorised cast)."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        kind, arrow = INTEGER_TYPES[pgtype.name]
        self._arrow = arrow
        super().__init__(column, pgtype, typmod, modes, nullable, primitive(kind), arrow)

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        return pc.cast(text, self._arrow)

    def _silver(self, text: pa.StringArray) -> pa.Array:
        return pc.cast(text, self._arrow)


class FloatConverter(BaseConverter):
    """REAL -> FLOAT32, DOUBLE PRECISION -> FLOAT64; ``NaN``/``Infinity`` become IEEE values."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        kind, arrow = FLOAT_TYPES[pgtype.name]
        self._arrow = arrow
        super().__init__(column, pgtype, typmod, modes, nullable, primitive(kind), arrow)

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        return pc.cast(text, self._arrow)

    def _silver(self, text: pa.StringArray) -> pa.Array:
        return pc.cast(text, self._arrow)


class StringConverter(BaseConverter):
    """Types carried as their text output, as STRING with an optional semantic name.

    The unchanged-TOAST placeholder is the placeholder string (TYPE-17).
    """

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool, semantic: str | None = None,
                 parameters: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(column, pgtype, typmod, modes, nullable,
                         primitive("string", semantic, parameters=parameters), pa.string())

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        return text

    def _silver(self, text: pa.StringArray) -> pa.Array:
        return text

    def bronze_placeholder(self) -> pa.Scalar | None:
        """The placeholder string; None for fixed-width types, which are never TOASTed."""
        if self.pgtype.name in _FIXED_WIDTH or self.pgtype.typtype == "e":
            return None
        return self._string_placeholder()


def enum_converter(column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                   nullable: bool) -> StringConverter:
    """ENUM -> STRING ``io.debezium.data.Enum`` with ``allowed`` = comma-joined labels."""
    allowed = ",".join(pgtype.enum_labels)
    return StringConverter(column, pgtype, typmod, modes, nullable,
                           "io.debezium.data.Enum", (("allowed", allowed),))
