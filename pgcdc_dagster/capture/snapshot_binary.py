"""Snapshot chunks in binary COPY: which columns travel natively, and their conversion.

``COPY ... (FORMAT binary)`` costs PostgreSQL less than text for numbers and timestamps
(no formatting) and spares us CSV parsing and text-to-number casts. A column travels in
its binary send format when we decode that format exactly (:data:`NATIVE`, by the type's
built-in OID, never a domain): integers, floats, booleans, TIMESTAMPTZ, DATE, and the
types whose binary format *is* their text output (text, varchar, bpchar, json; jsonb after
its version byte). Every other column is selected as its text output
(``concat(col)``, which calls the type's output function like COPY's text format, under
the same pinned session settings; NULL stays NULL), so every converter sees what it sees
in text mode.

:func:`convert_column` returns exactly ``fast_convert(conv, text)`` for the text
PostgreSQL would have printed; a native value outside the vectorised domain (a
TIMESTAMPTZ or DATE that is infinite, BC or beyond year 9999) makes the batch's column
take the text path, its PostgreSQL text rebuilt from the binary value
(:func:`pg_date_text`, :func:`pg_timestamptz_text`).
``tests/integration/test_snapshot_binary.py`` checks both paths agree on real output.
"""

from __future__ import annotations

import decimal
import struct
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from psycopg2 import sql

from pgcdc_dagster.capture.snapshot_fastpath import fast_convert
from pgcdc_dagster.cdc import copy_columns as cc
from pgcdc_dagster.cdc.copy_columns import BinaryRows
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.cdc.typeconv import calendar as cal
from pgcdc_dagster.cdc.typeconv.decimal_codec import int64_decimal_bytes
from pgcdc_dagster.cdc.typeconv.fixed_text import fixed_strings
from pgcdc_dagster.cdc.typeconv.numeric import NumericConverter
from pgcdc_dagster.cdc.typeconv.scalars import BooleanConverter, FloatConverter, IntegerConverter
from pgcdc_dagster.cdc.typeconv.temporal import DateConverter, TimestampTzConverter
from pgcdc_dagster.exceptions import DecodeError
from pgcdc_dagster.native import copyscan

EPOCH_2000_DAYS = 10_957
"""PostgreSQL's date epoch (2000-01-01) in Unix epoch days."""
EPOCH_2000_MICROS = EPOCH_2000_DAYS * cal.MICROS_PER_DAY
MIN_DAYS = cal.days_from_civil(1, 1, 1)
MAX_DAYS = cal.days_from_civil(9999, 12, 31)
MIN_MICROS = MIN_DAYS * cal.MICROS_PER_DAY
MAX_MICROS = (MAX_DAYS + 1) * cal.MICROS_PER_DAY - 1
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

NATIVE: dict[int, str] = {
    16: "bool", 21: "int2", 23: "int4", 20: "int8", 700: "float4", 701: "float8",
    25: "text", 1043: "text", 1042: "text", 114: "text", 3802: "jsonb",
    1184: "timestamptz", 1082: "date", 1700: "numeric",
}
"""Built-in type OIDs read in their binary format, and how."""

_NUMBER_DTYPE = {"int2": ">i2", "int4": ">i4", "int8": ">i8", "float4": ">f4", "float8": ">f8"}
_CONVERTER: dict[str, type] = {
    "bool": BooleanConverter, "int2": IntegerConverter, "int4": IntegerConverter,
    "int8": IntegerConverter, "float4": FloatConverter, "float8": FloatConverter,
    "timestamptz": TimestampTzConverter, "date": DateConverter, "numeric": NumericConverter,
}
"""Kinds decoded to values: only for exactly these converters (a column mapper subclass
works on text)."""

Converted = tuple[pa.Array, pa.Array]


def native_kind(conv: ColumnConverter) -> str | None:
    """How the column travels natively, or None for its text output."""
    pgtype = getattr(conv, "pgtype", None)
    kind = NATIVE.get(getattr(pgtype, "oid", -1))
    if kind is None:
        return None
    expected = _CONVERTER.get(kind)
    if expected is not None and type(conv) is not expected:
        return None
    if kind == "numeric" and _numeric_scale(conv) is None:
        return None
    return kind


NUMERIC_MAX_DIGITS = 18
"""NUMERIC(p,s) decoded natively up to this precision (the unscaled value fits an int64)."""


def _numeric_scale(conv: ColumnConverter) -> int | None:
    """The scale of a NUMERIC(p,s) column decoded natively (precise mode, p <= 18), or None
    (other modes, no typmod, negative scale: text output)."""
    if not isinstance(conv, NumericConverter) or conv.mode != "precise" or conv.ps is None:
        return None
    precision, scale = conv.ps
    if scale < 0 or precision > NUMERIC_MAX_DIGITS or \
            conv.silver_field.type != pa.decimal128(precision, scale):
        return None
    return scale


def binary_select(query: sql.Composable, columns: Sequence[str],
                  converters: Sequence[ColumnConverter]) -> sql.Composable:
    """The chunk query with its non-native columns turned into their text output."""
    kinds = [native_kind(c) for c in converters]
    if all(k is not None for k in kinds):
        return query
    items = [sql.Identifier(name) if kind is not None else
             sql.SQL("CASE WHEN num_nulls({c}) = 0 THEN concat({c}) END").format(
                 c=sql.Identifier(name))
             for name, kind in zip(columns, kinds, strict=True)]
    return sql.SQL("SELECT {} FROM ({}) AS _pgcdc_chunk").format(sql.SQL(", ").join(items),
                                                                 query)


# --- PostgreSQL text of the values the vectorised paths leave out -------------------------

def _civil_text(days: int) -> tuple[str, str]:
    """``YYYY-MM-DD`` of the day and its era suffix (`` BC``), as PostgreSQL prints it."""
    year, month, day = cal.civil_from_days(days)
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d}", " BC"
    return f"{year:04d}-{month:02d}-{day:02d}", ""


def pg_date_text(days_2000: int) -> str:
    """PostgreSQL's ISO output of a DATE given as its binary value."""
    if days_2000 == _INT32_MAX:
        return "infinity"
    if days_2000 == _INT32_MIN:
        return "-infinity"
    date, era = _civil_text(days_2000 + EPOCH_2000_DAYS)
    return date + era


def pg_timestamptz_text(micros_2000: int) -> str:
    """PostgreSQL's ISO output, in UTC, of a TIMESTAMPTZ given as its binary value."""
    if micros_2000 == _INT64_MAX:
        return "infinity"
    if micros_2000 == _INT64_MIN:
        return "-infinity"
    days, micros = divmod(micros_2000 + EPOCH_2000_MICROS, cal.MICROS_PER_DAY)
    date, era = _civil_text(days)
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{date} {hour:02d}:{minute:02d}:{second:02d}"
    if fraction:
        text += f".{fraction:06d}".rstrip("0")
    return f"{text}+00{era}"


_NUMERIC_SPECIAL = {0xC000: "NaN", 0xD000: "Infinity", 0xF000: "-Infinity"}


def pg_numeric_text(value: bytes) -> str:
    """PostgreSQL's output of a NUMERIC given as its binary value."""
    ndigits, weight, sign, dscale = struct.unpack_from(">hhHh", value)
    if sign in _NUMERIC_SPECIAL:
        return _NUMERIC_SPECIAL[sign]
    digits = struct.unpack_from(f">{ndigits}h", value, 8)
    unscaled = 0
    for d in digits:
        unscaled = unscaled * 10_000 + d
    exponent = 4 * (weight - ndigits + 1)
    number = decimal.Decimal((1 if sign == 0x4000 else 0,
                              tuple(int(c) for c in str(unscaled)), exponent))
    return f"{number:.{dscale}f}"


def _text_of(values: npt.NDArray[np.int64], null: npt.NDArray[np.bool_],
             fmt: Callable[[int], str]) -> pa.StringArray:
    out = pa.array([None if n else fmt(int(v)) for v, n in zip(values, null, strict=True)],
                   pa.string())
    assert isinstance(out, pa.StringArray)
    return out


# --- vectorised conversions -------------------------------------------------------------

def _arrow(values: npt.NDArray[np.generic], null: npt.NDArray[np.bool_],
           typ: pa.DataType) -> pa.Array:
    return pa.array(values, typ, mask=null if null.any() else None)


def _finish(conv: ColumnConverter, bronze: pa.Array, silver: pa.Array | None) -> Converted:
    """Debezium's fallback for a NULL in a NOT NULL column (then silver from bronze)."""
    if not conv.bronze_field.nullable and bronze.null_count:
        bronze = pc.fill_null(bronze, conv.bronze_fallback())
        silver = None
    if silver is None:
        silver = conv.from_bronze(bronze)
    return bronze, silver


def _civil_rows(days: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    """``YYYY-MM-DD`` rows of epoch days within years 1-9999 (H. Hinnant's algorithm)."""
    z = days + 719_468
    era = np.floor_divide(z, 146_097)
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + (month <= 2)
    out = np.empty((len(days), 10), dtype=np.uint8)
    for col, value, width in ((0, year, 4), (5, month, 2), (8, day, 2)):
        for i in range(width - 1, -1, -1):
            out[:, col + i] = 48 + value % 10
            value = value // 10
    out[:, 4] = out[:, 7] = ord("-")
    return out


def _clock_table() -> npt.NDArray[np.uint8]:
    """``HH:MM:SS`` of every second of a day."""
    second = np.arange(86_400)
    digits = [second // 36_000, second // 3600 % 10, None, second // 600 % 6,
              second // 60 % 10, None, second % 60 // 10, second % 10]
    out = np.empty((86_400, 8), dtype=np.uint8)
    for i, d in enumerate(digits):
        out[:, i] = ord(":") if d is None else 48 + d
    return out


_CLOCK = np.ascontiguousarray(_clock_table()).view("S8").ravel()
_THOUSANDS = np.array([b"%03d" % i for i in range(1000)], dtype="S3")
_DAY_TABLE_SPAN = 1 << 20
"""Batches whose days span at most this many format each day once, then gather."""


def _zoned_layout(width: int) -> np.dtype[np.void]:
    """``YYYY-MM-DDTHH:MM:SS[.f{width}]Z`` as a record of fixed-width byte fields."""
    names, formats, offsets = ["date", "T", "clock"], ["S10", "S1", "S8"], [0, 10, 11]
    if width:
        names += ["dot", "ms"]
        formats += ["S1", f"S{min(width, 3)}"]
        offsets += [19, 20]
        if width > 3:
            names.append("us")
            formats.append(f"S{width - 3}")
            offsets.append(23)
    size = 20 + (width + 1 if width else 0)
    names.append("Z")
    formats.append("S1")
    offsets.append(size - 1)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": size})


def _zoned_strings(micros: npt.NDArray[np.int64], null: npt.NDArray[np.bool_],
                   width: int | None) -> pa.StringArray:
    """``YYYY-MM-DDTHH:MM:SS[.f{width}]Z`` of epoch microseconds within years 1-9999.

    Each part is one gather from a small table (dates, clock times, groups of three
    fraction digits, truncated to ``width``) into its field of a fixed-width record."""
    valid = ~null
    some_null = bool(null.any())
    native = copyscan.library()
    if native is not None and 0 <= (width or 0) <= 6:
        rows = native.zoned_strings(micros, null if some_null else None, width or 0,
                                    _zoned_layout(width or 0).itemsize)
        return fixed_strings(rows, valid if some_null else None, len(micros))
    m = micros[valid] if some_null else micros
    days, rest = np.divmod(m, cal.MICROS_PER_DAY)
    seconds, fraction = np.divmod(rest, 1_000_000)
    layout = _zoned_layout(width or 0)
    out = np.empty(len(m), dtype=layout)
    if len(m):
        first = int(days.min())
        span = int(days.max()) - first + 1
        if span <= _DAY_TABLE_SPAN:
            table = _civil_rows(np.arange(first, first + span, dtype=np.int64))
            out["date"] = np.ascontiguousarray(table).view("S10").ravel()[days - first]
        else:
            out["date"] = np.ascontiguousarray(_civil_rows(days)).view("S10").ravel()
    out["T"] = b"T"
    out["clock"] = _CLOCK[seconds]
    if width:
        out["dot"] = b"."
        out["ms"] = _THOUSANDS[fraction // 1000]  # a narrower field keeps the first digits
        if width > 3:
            out["us"] = _THOUSANDS[fraction % 1000]
    out["Z"] = b"Z"
    rows = out.view(np.uint8).reshape(len(m), layout.itemsize)
    return fixed_strings(rows, valid if some_null else None, len(micros))


def _epoch_values(rows: BinaryRows, col: int, dtype: str, epoch: int, lo: int, hi: int
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], bool]:
    """A temporal column's binary values (since 2000-01-01), its NULLs, and whether every
    value shifted to the Unix ``epoch`` lies within ``[lo, hi]`` (years 1-9999, finite)."""
    null = cc.nulls(rows, col)
    raw = cc.fixed_values(rows, col, dtype).astype(np.int64, copy=False)
    live = raw[~null] if null.any() else raw
    inside = not len(live) or (int(live.min()) >= lo - epoch and int(live.max()) <= hi - epoch)
    return raw, null, inside


def _timestamptz(conv: ColumnConverter, rows: BinaryRows, col: int) -> Converted:
    assert isinstance(conv, TimestampTzConverter)
    raw, null, inside = _epoch_values(rows, col, ">i8", EPOCH_2000_MICROS, MIN_MICROS,
                                      MAX_MICROS)
    if not inside:
        return fast_convert(conv, _text_of(raw, null, pg_timestamptz_text))
    micros = raw + EPOCH_2000_MICROS
    bronze = _zoned_strings(micros, null, conv.width)
    silver = _arrow(micros, null, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    return _finish(conv, bronze, silver)


def _date(conv: ColumnConverter, rows: BinaryRows, col: int) -> Converted:
    raw, null, inside = _epoch_values(rows, col, ">i4", EPOCH_2000_DAYS, MIN_DAYS, MAX_DAYS)
    if not inside:
        return fast_convert(conv, _text_of(raw, null, pg_date_text))
    days = (raw + EPOCH_2000_DAYS).astype(np.int32)
    bronze = _arrow(days, null, pa.int32())
    return _finish(conv, bronze, bronze.cast(pa.date32()))


_POW10 = np.array([10**k for k in range(19)], dtype=np.int64)
_BOUND_EXPONENTS = 40
_POW10_FLOAT = np.power(10.0, np.arange(-_BOUND_EXPONENTS, _BOUND_EXPONENTS + 1,
                                        dtype=np.float64))
"""10.0 ** k for k in -40..40, looked up per value (a float power per value costs more than
the whole digit decoding)."""
_WORD_GROUPS = 4
"""Digit groups (base 10000) read as one 8-byte word: values of up to 16 digits."""
_GROUP_MASKS = np.array([[0xFFFF] * k + [0] * (_WORD_GROUPS - k) for k in
                         range(_WORD_GROUPS + 1)], dtype=np.uint16)
"""Row ``k``: keeps the first ``k`` digit groups of a word (the bytes after a value's last
group belong to the next field)."""
_GROUP_WEIGHTS = np.array([10_000**k for k in range(_WORD_GROUPS - 1, -1, -1)],
                          dtype=np.int64)


def _unscaled_in_word(data: npt.NDArray[np.uint8], start: npt.NDArray[np.int64],
                      ndigits: npt.NDArray[np.int64], weight: npt.NDArray[np.int64],
                      scale: int) -> npt.NDArray[np.int64] | None:
    """Unscaled values of at most four digit groups each (ndigits 0 for NULL rows): the
    groups as one big-endian word, masked to the value's own and read as the integer ``V``
    of four groups, so the value is ``V * 10000^(weight - 3)``; None when a value has more
    digits than the scale keeps."""
    n = len(start)
    groups = cc.numbers_at(data, "V8")[start + 8].view(">u2").reshape(n, _WORD_GROUPS)
    groups = groups & _GROUP_MASKS[ndigits]
    v = groups.astype(np.int64) @ _GROUP_WEIGHTS
    exponent = 4 * (weight - (_WORD_GROUPS - 1)) + scale
    up = exponent >= 0
    factor = _POW10[np.clip(np.abs(exponent), 0, 18)]
    whole, rest = np.divmod(v, factor)
    if bool((~up & ((rest != 0) | ((exponent < -18) & (v != 0)))).any()):
        return None
    out: npt.NDArray[np.int64] = np.where(up, v * factor, whole)
    return out


def _unscaled_by_digit(int16: npt.NDArray[np.generic], start: npt.NDArray[np.int64],
                       ndigits: npt.NDArray[np.int64], weight: npt.NDArray[np.int64],
                       live: npt.NDArray[np.bool_], scale: int
                       ) -> npt.NDArray[np.int64] | None:
    """Unscaled values of any digit count, one digit group at a time (see
    :func:`_unscaled_in_word`)."""
    unscaled = np.zeros(len(start), dtype=np.int64)
    for i in range(int(ndigits[live].max(initial=0))):
        has = live & (ndigits > i)
        digit = int16[np.where(has, start + 8 + 2 * i, 0)].astype(np.int64)
        exponent = 4 * (weight - i) + scale
        up = has & (exponent >= 0)
        unscaled += np.where(up, digit * _POW10[np.clip(exponent, 0, 18)], 0)
        down = has & (exponent < 0)
        if down.any():
            divisor = _POW10[np.clip(-exponent, 0, 18)]
            if bool((down & (digit % divisor != 0)).any()):  # more digits than the scale
                return None
            unscaled += np.where(down, digit // divisor, 0)
    return unscaled


def _numeric(conv: ColumnConverter, rows: BinaryRows, col: int) -> Converted:
    """NUMERIC(p,s), p <= 18, precise: the unscaled value from the base-10000 digits."""
    scale = _numeric_scale(conv)
    assert scale is not None
    null = cc.nulls(rows, col)
    native = copyscan.library()
    unscaled = None if native is None else native.numeric_unscaled(
        rows.data, rows.starts[col], rows.lengths[col], scale, _POW10_FLOAT,
        10.0 ** NUMERIC_MAX_DIGITS)
    if unscaled is None:
        unscaled = _numpy_numeric(rows, col, scale, null)
        if unscaled is None:  # NaN, infinities, values beyond the column's typmod: the
            # converter decides
            length = rows.lengths[col]
            values = [None if null[r] else pg_numeric_text(
                rows.data[rows.starts[col][r]:rows.starts[col][r] + length[r]].tobytes())
                for r in range(len(null))]
            return fast_convert(conv, pa.array(values, pa.string()))
    words = np.empty((len(null), 2), dtype=np.int64)
    words[:, 0] = unscaled
    words[:, 1] = np.where(unscaled < 0, -1, 0)
    silver = pa.Array.from_buffers(conv.silver_field.type, len(null),
                                   [cc.validity(null), pa.py_buffer(words)],
                                   null_count=int(null.sum()))
    return _finish(conv, _decimal_bytes(native, unscaled, null), silver)


def _decimal_bytes(native: copyscan.CopyScan | None, unscaled: npt.NDArray[np.int64],
                   null: npt.NDArray[np.bool_]) -> pa.BinaryArray:
    """Kafka Connect Decimal bytes of the unscaled values (compiled when available)."""
    if native is None:
        return int64_decimal_bytes(unscaled, null)
    offsets, data = native.decimal_bytes(unscaled, null)
    nulls = int(np.count_nonzero(null))
    out = pa.Array.from_buffers(pa.binary(), len(unscaled),
                                [cc.validity(null) if nulls else None, pa.py_buffer(offsets),
                                 pa.py_buffer(data)], null_count=nulls)
    assert isinstance(out, pa.BinaryArray)
    return out


def _numpy_numeric(rows: BinaryRows, col: int, scale: int, null: npt.NDArray[np.bool_]
                   ) -> npt.NDArray[np.int64] | None:
    """The signed unscaled values (0 for NULL), or None when the converter must decide."""
    start = np.where(null, 0, rows.starts[col])
    int16 = cc.numbers_at(rows.data, ">i2")
    ndigits, weight = int16[start].astype(np.int64), int16[start + 2].astype(np.int64)
    sign = int16[start + 4].astype(np.int64) & 0xFFFF
    live = ~null
    length = rows.lengths[col]
    plain = (sign == 0) | (sign == 0x4000)
    # |value| < (first digit + 1) * 10000^weight, so the unscaled value stays below 10^18
    # (an int64) when that bound, times 10^scale, does
    first = int16[np.where(live & (ndigits > 0), start + 8, 0)].astype(np.float64)
    bound = (first + 1) * _POW10_FLOAT[np.clip(4 * weight + scale, -_BOUND_EXPONENTS,
                                               _BOUND_EXPONENTS) + _BOUND_EXPONENTS]
    fits = (ndigits == 0) | (bound <= 10.0 ** NUMERIC_MAX_DIGITS)
    unscaled: npt.NDArray[np.int64] | None = None
    if not bool((live & ~(plain & fits & (length == 8 + 2 * ndigits))).any()):
        ndigits = np.where(live, ndigits, 0)
        unscaled = _unscaled_in_word(rows.data, start, ndigits, weight, scale) \
            if int(ndigits.max(initial=0)) <= _WORD_GROUPS else \
            _unscaled_by_digit(int16, start, ndigits, weight, live, scale)
    if unscaled is None:
        return None
    signed: npt.NDArray[np.int64] = np.where(sign == 0x4000, -unscaled, unscaled)
    return signed


def _number(conv: ColumnConverter, rows: BinaryRows, col: int, dtype: str) -> Converted:
    null = cc.nulls(rows, col)
    bronze = _arrow(cc.fixed_values(rows, col, dtype), null, conv.bronze_field.type)
    same = conv.silver_field.type == bronze.type
    return _finish(conv, bronze, bronze if same else None)


def _bool(conv: ColumnConverter, rows: BinaryRows, col: int) -> Converted:
    null = cc.nulls(rows, col)
    values = cc.fixed_values(rows, col, ">u1")
    if int(values.max(initial=0)) > 1:
        raise DecodeError(f"column {conv.bronze_field.name}: boolean byte "
                          f"{int(values.max())}")
    bronze = _arrow(values.astype(bool), null, pa.bool_())
    return _finish(conv, bronze, bronze)


def _text(conv: ColumnConverter, rows: BinaryRows, col: int, skip: int) -> Converted:
    if skip:  # jsonb: a version byte, then the text
        null = cc.nulls(rows, col)
        starts = rows.starts[col][~null]
        if len(starts) and bool((rows.data[starts] != 1).any()):
            raise DecodeError(f"column {conv.bronze_field.name}: unknown jsonb binary version")
    return fast_convert(conv, cc.string_values(rows, col, skip))


def convert_column(conv: ColumnConverter, kind: str | None, rows: BinaryRows,
                   col: int) -> Converted:
    """``(bronze, silver)`` of one column of a binary batch; ``kind`` from
    :func:`native_kind` (None: the column was selected as text)."""
    if kind is None or kind == "text":
        return _text(conv, rows, col, 0)
    if kind == "jsonb":
        return _text(conv, rows, col, 1)
    if kind == "bool":
        return _bool(conv, rows, col)
    if kind in _NUMBER_DTYPE:
        return _number(conv, rows, col, _NUMBER_DTYPE[kind])
    if kind == "numeric":
        return _numeric(conv, rows, col)
    if kind == "timestamptz":
        return _timestamptz(conv, rows, col)
    if kind == "date":
        return _date(conv, rows, col)
    raise ValueError(f"unknown native kind {kind!r}")
