"""The type-conversion contract: PostgreSQL type descriptions, handling modes, converter protocol.

A :class:`PgType` is what ``postgres.catalog.load_types`` reads from ``pg_type`` (arrays, domains,
enums and ranges resolved recursively). :class:`TypeModes` carries the Debezium connector
properties that change how a value is encoded (CFG-39..45, TYPE-09, TYPE-10, TYPE-24).
A :class:`ColumnConverter` turns one column of text-format values (exactly what pgoutput text
mode and ``COPY ... (FORMAT text|csv)`` deliver) into the bronze (Debezium) and silver (native)
Arrow representations, a whole column at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from pgcdc_dagster.exceptions import ConfigurationError

TIME_PRECISION_MODES = ("adaptive", "adaptive_time_microseconds", "connect")
DECIMAL_MODES = ("precise", "double", "string")
INTERVAL_MODES = ("numeric", "string")
BINARY_MODES = ("bytes", "base64", "base64-url-safe", "hex")
HSTORE_MODES = ("json", "map")


@dataclass(frozen=True, slots=True)
class PgType:
    """A PostgreSQL type as described by ``pg_type`` (and ``pg_enum`` / ``pg_range``).

    Attributes:
        oid: The type's oid.
        schema: Namespace of the type (``pg_catalog``, ``public``, the extension's schema...).
        name: ``typname``, e.g. ``int4``, ``_int4``, ``hstore``, ``geometry``.
        typtype: ``b`` base, ``d`` domain, ``e`` enum, ``r`` range, ``m`` multirange,
            ``c`` composite, ``p`` pseudo.
        category: ``typcategory`` (``A`` array, ``N`` numeric, ``S`` string, ...).
        element: Element type of an array type.
        base: Base type of a domain.
        enum_labels: Labels of an enum type, in ``enumsortorder``.
        subtype: Subtype of a range type.
        base_typmod: ``typtypmod`` of a domain (the length/scale the domain declares, TYPE-11).
        delimiter: ``typdelim``, the separator of this type's elements in array text
            (``,`` for nearly all types, ``;`` for box, ``:`` for PostGIS geometry).
    """

    oid: int
    schema: str
    name: str
    typtype: str
    category: str
    element: PgType | None = None
    base: PgType | None = None
    enum_labels: tuple[str, ...] = ()
    subtype: PgType | None = None
    base_typmod: int = -1
    delimiter: str = ","

    @property
    def is_array(self) -> bool:
        """True for an array type (``typcategory = 'A'`` with an element type)."""
        return self.element is not None and self.category == "A"

    @property
    def qualified_name(self) -> str:
        """``schema.name`` as used in messages."""
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True, slots=True)
class TypeModes:
    """Debezium handling modes that change value encodings; field docs give the property names.

    Attributes:
        time_precision: ``time.precision.mode`` (CFG-39, TYPE-03): ``adaptive`` |
            ``adaptive_time_microseconds`` | ``connect``.
        decimal: ``decimal.handling.mode`` (CFG-40): ``precise`` | ``double`` | ``string``.
        interval: ``interval.handling.mode`` (CFG-42): ``numeric`` | ``string``.
        binary: ``binary.handling.mode`` (CFG-43, TYPE-10): ``bytes`` | ``base64`` |
            ``base64-url-safe`` | ``hex``.
        hstore: ``hstore.handling.mode`` (CFG-41, TYPE-09): ``json`` | ``map``.
        include_unknown: ``include.unknown.datatypes`` (CFG-44, TYPE-12).
        unavailable_placeholder: ``unavailable.value.placeholder`` (CFG-45); a ``hex:`` prefix
            means the rest is hex-encoded octets.
        money_fraction_digits: ``money.fraction.digits`` (TYPE-24), the scale of MONEY values.
    """

    time_precision: str = "adaptive"
    decimal: str = "precise"
    interval: str = "numeric"
    binary: str = "bytes"
    hstore: str = "json"
    include_unknown: bool = False
    unavailable_placeholder: str = "__debezium_unavailable_value"
    money_fraction_digits: int = 2

    def __post_init__(self) -> None:
        checks = (
            ("time.precision.mode", self.time_precision, TIME_PRECISION_MODES),
            ("decimal.handling.mode", self.decimal, DECIMAL_MODES),
            ("interval.handling.mode", self.interval, INTERVAL_MODES),
            ("binary.handling.mode", self.binary, BINARY_MODES),
            ("hstore.handling.mode", self.hstore, HSTORE_MODES),
        )
        for prop, value, allowed in checks:
            if value not in allowed:
                raise ConfigurationError(
                    f"{prop} = {value!r} is not supported; use one of {', '.join(allowed)}"
                )
        if self.money_fraction_digits < 0:
            raise ConfigurationError(
                f"money.fraction.digits = {self.money_fraction_digits} must be >= 0"
            )

    @property
    def placeholder_bytes(self) -> bytes:
        """The placeholder as octets: ``hex:`` prefixed values are decoded (STR-49)."""
        if self.unavailable_placeholder.startswith("hex:"):
            return bytes.fromhex(self.unavailable_placeholder[4:])
        return self.unavailable_placeholder.encode("utf-8")

    @property
    def placeholder_text(self) -> str:
        """The placeholder as a string, as Debezium builds it from the octets."""
        return self.placeholder_bytes.decode("utf-8", errors="replace")


@runtime_checkable
class ColumnConverter(Protocol):
    """Converts one column of text-format values to bronze (Debezium) and silver (native) Arrow.

    ``bronze_field`` is the Arrow field of the Debezium literal type; its metadata carries the
    semantic name, version and parameters and the PostgreSQL type (see ``base.py``).
    ``silver_field`` is the native analyst type (see ``docs/types.md``). ``dropped`` is True
    when Debezium would omit the column (unknown type, ``include.unknown.datatypes`` false).
    """

    bronze_field: pa.Field
    silver_field: pa.Field
    dropped: bool

    def to_bronze(self, text: pa.Array) -> pa.Array:
        """Text output values (nulls for SQL NULL) -> Debezium-encoded values."""
        ...

    def to_silver(self, text: pa.Array) -> pa.Array:
        """Text output values (nulls for SQL NULL) -> native values."""
        ...

    def from_bronze(self, values: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Bronze values -> native values; ``to_silver(t) == from_bronze(to_bronze(t))``."""
        ...

    def bronze_fallback(self) -> pa.Scalar:
        """Debezium's value for a null in a NOT NULL column (the type's zero)."""
        ...

    def bronze_placeholder(self) -> pa.Scalar | None:
        """The bronze value Debezium stores for an unchanged TOAST column, if it has one."""
        ...

    def to_json(self, value: object) -> object:
        """A bronze value (from ``to_pylist``) -> the value Debezium's JsonConverter writes."""
        ...

    def connect_schema(self) -> dict[str, Any]:
        """The Kafka Connect JSON schema fragment Debezium writes for this field."""
        ...
