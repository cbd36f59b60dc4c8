"""NUMERIC/DECIMAL and MONEY under ``decimal.handling.mode`` (CFG-40, seed-inventory §5.3).

Bronze (Debezium):
- ``precise`` + NUMERIC(p,s): BYTES ``org.apache.kafka.connect.data.Decimal`` with parameters
  ``scale`` and ``connect.decimal.precision``; the value is the unscaled integer as big-endian
  two's complement (``BigDecimal.unscaledValue().toByteArray()``).
- ``precise`` + unconstrained NUMERIC: STRUCT ``io.debezium.data.VariableScaleDecimal``
  {scale INT32, value BYTES}, trailing zeros stripped first (``stripTrailingZeros``).
- ``double``: FLOAT64; ``string``: STRING as ``BigDecimal.toString()``.
- NaN / +-Infinity (TYPE-08): ``double`` -> NaN / +-inf; ``string`` -> ``NAN`` /
  ``POSITIVE_INFINITY`` / ``NEGATIVE_INFINITY``; ``precise`` cannot carry them, so, as
  Debezium does, the conversion fails (:class:`UnsupportedTypeError` naming the property).
- MONEY (TYPE-24): ``precise`` -> Decimal with ``scale`` = ``money.fraction.digits``;
  ``double`` -> FLOAT64; ``string`` -> Java ``Double.toString`` of the amount (Debezium reads
  money as a double).

Silver (decoded from the bronze value, so ``double`` mode is as lossy there as in bronze):
NUMERIC(p,s) with p <= 38 -> ``decimal128(p, s)``; NUMERIC(p,s) with p > 38 -> ``string`` with
exactly s fraction digits (PostgreSQL's text); unconstrained NUMERIC -> ``string`` in plain
notation with trailing fractional zeros stripped (``12.3400`` -> ``12.34``; the numeric value
is exact, Delta decimals stop at 38 digits). NaN and infinities (string/double modes) become
NULL in a decimal column and ``NaN`` / ``Infinity`` / ``-Infinity`` in a string one.
MONEY -> ``decimal128(19, fraction digits)``.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.typeconv.base import BaseConverter, map_values, patch
from pgcdc_dagster.cdc.typeconv.decimal_codec import (
    bytes_to_decimal,
    bytes_to_unscaled,
    decimal_array_to_bytes,
    parse_unscaled,
    plain_decimal,
    text_to_decimal_bytes,
    unscaled_bytes,
)
from pgcdc_dagster.cdc.typeconv.javafmt import java_double_string
from pgcdc_dagster.cdc.typeconv.model import PgType, TypeModes
from pgcdc_dagster.cdc.typeconv.schema import ConnectSchema, primitive
from pgcdc_dagster.exceptions import UnsupportedTypeError

DECIMAL_NAME = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_NAME = "io.debezium.data.VariableScaleDecimal"
SPECIAL_STRINGS = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY",
                   "-Infinity": "NEGATIVE_INFINITY"}
SPECIAL_VALUES = {v: k for k, v in SPECIAL_STRINGS.items()}
WIDE = Context(prec=200_000)
VARIABLE_SCALE_SCHEMA = ConnectSchema(
    "struct", True, VARIABLE_SCALE_NAME, 1, "Variable scaled decimal",
    fields=(("scale", ConnectSchema("int32", False)), ("value", ConnectSchema("bytes", False))),
)


def numeric_typmod(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of a NUMERIC typmod, None when unconstrained (-1).

    PostgreSQL 15+ allows a negative scale, stored as an 11-bit signed field.
    """
    if typmod < 4:
        return None
    mod = typmod - 4
    scale = ((mod & 0x7FF) ^ 1024) - 1024
    return (mod >> 16) & 0xFFFF, scale


def decimal_schema(precision: int, scale: int) -> ConnectSchema:
    """Kafka Connect Decimal as Debezium builds it (``SpecialValueDecimal.builder``)."""
    return primitive("bytes", DECIMAL_NAME, parameters=(
        ("scale", str(scale)), ("connect.decimal.precision", str(precision))))


class NumericConverter(BaseConverter):
    """NUMERIC/DECIMAL with and without precision and scale, in all three decimal modes."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        self.ps = numeric_typmod(typmod)
        self.mode = modes.decimal
        schema: ConnectSchema
        if self.mode == "double":
            schema = primitive("float64")
        elif self.mode == "string":
            schema = primitive("string")
        elif self.ps is None:
            schema = VARIABLE_SCALE_SCHEMA
        else:
            schema = decimal_schema(*self.ps)
        silver: pa.DataType = pa.string()
        if self.ps is not None and self.ps[0] - min(self.ps[1], 0) <= 38:
            silver = pa.decimal128(self.ps[0] - min(self.ps[1], 0), max(self.ps[1], 0))
        super().__init__(column, pgtype, typmod, modes, nullable, schema, silver)

    def _fallback_value(self) -> object:
        if self.mode == "precise":
            return {"scale": 0, "value": b"\x00"} if self.ps is None else b"\x00"
        return "0" if self.mode == "string" else 0.0

    def _specials(self, text: pa.StringArray) -> pa.Array:
        return pc.is_in(text, value_set=pa.array(list(SPECIAL_STRINGS)))

    def _reject_specials(self, text: pa.StringArray) -> None:
        special = self._specials(text)
        if pc.any(special).as_py():
            bad = pc.filter(text, special)[0].as_py()
            raise UnsupportedTypeError(
                f"column {self.column!r} ({self.pgtype.qualified_name}) holds {bad!r}, which "
                "decimal.handling.mode=precise cannot represent (TYPE-08); set "
                "decimal.handling.mode to 'string' or 'double'")

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        if self.mode == "double":
            return pc.cast(text, pa.float64())
        if self.mode == "string":
            return self._as_java_string(text)
        self._reject_specials(text)
        if self.ps is None:
            return variable_scale(text)
        precision, scale = self.ps
        if scale < 0:
            return map_values(text, lambda v: unscaled_bytes(parse_unscaled(v, scale)),
                              pa.binary())
        return text_to_decimal_bytes(text, precision, scale)

    def _as_java_string(self, text: pa.StringArray) -> pa.Array:
        # PostgreSQL's plain text, as Debezium 3.6 writes it (BigDecimal.toPlainString: no
        # exponent even below 1E-6); only the specials are renamed.
        odd = self._specials(text)
        return patch(text, text, odd, lambda v: SPECIAL_STRINGS[v])

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        target = self.silver_field.type
        if self.mode == "precise" and self.ps is not None and self.ps[1] >= 0 \
                and pa.types.is_decimal(target):
            return bytes_to_decimal(values, target)
        return pa.array([None if v is None else self._silver_value(self._decode(v))
                         for v in values.to_pylist()], type=target)

    def _decode(self, value: Any) -> Decimal:
        """One bronze value -> the decimal it encodes (NaN / infinities included)."""
        if self.mode == "double":
            return Decimal(repr(value)) if math.isfinite(value) else Decimal(str(value))
        if self.mode == "string":
            return Decimal(SPECIAL_VALUES.get(value, value))
        if isinstance(value, dict):
            return Decimal(bytes_to_unscaled(value["value"])).scaleb(-value["scale"], WIDE)
        assert self.ps is not None
        return Decimal(bytes_to_unscaled(value)).scaleb(-self.ps[1], WIDE)

    def _silver_value(self, value: Decimal) -> Decimal | str | None:
        if pa.types.is_decimal(self.silver_field.type):
            if not value.is_finite():
                return None
            return value.quantize(Decimal(1).scaleb(-self.silver_field.type.scale), context=WIDE)
        if self.ps is not None and value.is_finite():
            return format(value.quantize(Decimal(1).scaleb(-self.ps[1]), context=WIDE), "f")
        return plain_decimal(value)


def variable_scale(text: pa.StringArray) -> pa.StructArray:
    """Unconstrained NUMERIC text -> VariableScaleDecimal {scale, value}, vectorised.

    Trailing fractional zeros are stripped (``stripTrailingZeros``, never a negative scale),
    the scale is the count of remaining fraction digits, the value the digits without the
    point. Values of more than 38 digits take the per-value path.
    """
    has_point = pc.match_substring(text, ".")
    trimmed = pc.ascii_rtrim(pc.ascii_rtrim(text, characters="0"), characters=".")
    stripped = pc.if_else(has_point, trimmed, text)
    dot = pc.find_substring(stripped, ".")
    length = pc.utf8_length(stripped)
    scale = pc.if_else(pc.less(dot, 0), 0, pc.subtract(pc.subtract(length, dot), 1))
    digits = pc.replace_substring(stripped, ".", "")
    long_ = pc.greater(pc.utf8_length(pc.replace_substring(digits, "-", "")), 38)
    short = pc.if_else(long_, pa.scalar(None, pa.string()), digits)
    values = decimal_array_to_bytes(pc.cast(short, pa.decimal128(38, 0)))
    values = patch(values, digits, long_, lambda v: unscaled_bytes(int(v)))
    valid = pc.is_valid(text)
    return pa.StructArray.from_arrays(
        [pc.fill_null(pc.cast(scale, pa.int32()), 0), pc.fill_null(values, b"")],
        fields=[pa.field("scale", pa.int32(), False), pa.field("value", pa.binary(), False)],
        mask=pc.invert(valid),
    )


class MoneyConverter(BaseConverter):
    """MONEY under ``decimal.handling.mode`` with ``money.fraction.digits`` (TYPE-24).

    The text output is locale-formatted (``$1,234.56``, ``-$1,234.56``); currency symbols
    and group separators are dropped; a ``.`` decimal point is assumed (lc_monetary C/en_*).
    """

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        self.mode = modes.decimal
        self.digits = modes.money_fraction_digits
        schema = {
            "double": primitive("float64"),
            "string": primitive("string"),
            "precise": primitive("bytes", DECIMAL_NAME,
                                 parameters=(("scale", str(self.digits)),)),
        }[self.mode]
        silver = pa.decimal128(17 + max(self.digits, 2), self.digits)
        super().__init__(column, pgtype, typmod, modes, nullable, schema, silver)

    def _fallback_value(self) -> object:
        return {"precise": b"\x00", "string": "0." + "0" * self.digits if self.digits else "0",
                "double": 0.0}[self.mode]

    @staticmethod
    def _clean(text: pa.StringArray) -> pa.Array:
        neg = pc.or_(pc.match_substring(text, "-"), pc.match_substring(text, "("))
        digits = pc.replace_substring_regex(text, r"[^0-9.]", "")
        return pc.if_else(neg, pc.binary_join_element_wise("-", digits, ""), digits)

    def _amount(self, v: str) -> Decimal:
        return Decimal(v).quantize(Decimal(1).scaleb(-self.digits), rounding=ROUND_HALF_UP)

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        clean = self._clean(text)
        if self.mode == "double":
            return pc.cast(clean, pa.float64())
        if self.mode == "string":
            return map_values(clean, lambda v: java_double_string(float(v)), pa.string())
        return map_values(clean, lambda v: unscaled_bytes(
            parse_unscaled(str(self._amount(v)), self.digits)), pa.binary())

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        if self.mode == "precise":
            return bytes_to_decimal(values, self.silver_field.type)
        return pa.array([None if v is None else self._amount(repr(v) if self.mode == "double"
                                                             else v)
                         for v in values.to_pylist()], type=self.silver_field.type)
