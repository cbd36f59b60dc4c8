"""Snapshot chunks read as Arrow: which columns travel natively, and their conversion.

The chunk's query runs through :mod:`pgcdc_dagster.postgres.arrow_reader` (ADBC, binary
COPY). A column travels as the driver's native Arrow type when the Debezium encodings can
be computed from it exactly with Arrow compute (:data:`NATIVE`, by the type's built-in OID,
never a domain, and only for exactly the converter built for it): integers, floats,
booleans, TIMESTAMPTZ, DATE, and the types whose Arrow value *is* their text output (text,
varchar, bpchar, json, jsonb). Every other column is selected as its text output
(``concat(col)``, which calls the type's output function under the reader's pinned session
settings; NULL stays NULL) and converted by the column's own text converter, exactly as a
streamed value is. NUMERIC travels as text too: the driver's own NUMERIC to string
conversion costs more than PostgreSQL's output function (measured in docs/bench/).

A TIMESTAMPTZ's ``ZonedTimestamp`` text is built from the microseconds by numpy gathers from
small tables (dates, clock times, fraction digits), several times faster than Arrow's
timestamp-to-string cast.

The driver cannot represent every TIMESTAMPTZ or DATE (``infinity`` overflows its
arithmetic); so beside each of those columns the query selects a guard column, the value's
text when it lies outside years 1-9999 (infinite, BC, far future) and NULL otherwise. A
batch whose guard holds a value converts that column from text (the native values printed
as PostgreSQL prints them, the guard's text for the others), so the text converter decides
as it does for streamed values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from psycopg2 import sql

from pgcdc_dagster.capture.snapshot_fastpath import fast_convert
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.cdc.typeconv import calendar as cal
from pgcdc_dagster.cdc.typeconv.fixed_text import fixed_strings
from pgcdc_dagster.cdc.typeconv.scalars import BooleanConverter, FloatConverter, IntegerConverter
from pgcdc_dagster.cdc.typeconv.temporal import DateConverter, TimestampTzConverter
from pgcdc_dagster.postgres.arrow_reader import text_output

NATIVE: dict[int, str] = {
    16: "bool", 21: "int", 23: "int", 20: "int", 700: "float", 701: "float",
    25: "text", 1043: "text", 1042: "text", 114: "text", 3802: "text",
    1184: "timestamptz", 1082: "date",
}
"""Built-in type OIDs read as the driver's Arrow type, and how they convert."""
_CONVERTER: dict[str, type] = {
    "bool": BooleanConverter, "int": IntegerConverter, "float": FloatConverter,
    "timestamptz": TimestampTzConverter, "date": DateConverter,
}
"""Kinds converted from values: only for exactly these converters (a column mapper
subclass works on text)."""
GUARDED = {"timestamptz": ("'0001-01-01 00:00:00+00'::timestamptz",
                           "'10000-01-01 00:00:00+00'::timestamptz"),
           "date": ("'0001-01-01'::date", "'10000-01-01'::date")}
"""Kinds selected with a guard column, and the range the native conversion covers."""

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
    return kind


def arrow_select(query: sql.Composable, columns: Sequence[str],
                 kinds: Sequence[str | None]) -> sql.Composable:
    """The chunk query with its non-native columns turned into their text output and a
    guard column after each guarded one (see the module's docstring)."""
    items: list[sql.Composable] = []
    for name, kind in zip(columns, kinds, strict=True):
        col = sql.Identifier(name)
        if kind is None:
            items.append(text_output(name))
            continue
        items.append(col)
        if kind in GUARDED:
            lo, hi = GUARDED[kind]
            items.append(sql.SQL("CASE WHEN {c} IS NULL OR ({c} >= {lo} AND {c} < {hi}) "
                                 "THEN NULL ELSE {c}::text END").format(
                c=col, lo=sql.SQL(lo), hi=sql.SQL(hi)))
    return sql.SQL("SELECT {} FROM ({}) AS _pgcdc_chunk").format(sql.SQL(", ").join(items),
                                                                 query)


def width(kinds: Sequence[str | None]) -> int:
    """Columns of a batch of :func:`arrow_select`'s query."""
    return len(kinds) + sum(1 for k in kinds if k in GUARDED)


def _finish(conv: ColumnConverter, bronze: pa.Array, silver: pa.Array | None) -> Converted:
    """Debezium's fallback for a NULL in a NOT NULL column (then silver from bronze)."""
    if not conv.bronze_field.nullable and bronze.null_count:
        bronze = pc.fill_null(bronze, conv.bronze_fallback())
        silver = None
    if silver is None:
        silver = conv.from_bronze(bronze)
    return bronze, silver


def _storage(values: pa.Array) -> pa.Array:
    return values.storage if isinstance(values, pa.ExtensionArray) else values


def _text(values: pa.Array) -> pa.Array:
    values = _storage(values)
    return values if values.type == pa.string() else pc.cast(values, pa.string())


def _guarded_text(values: pa.Array, guard: pa.Array, printed: pa.Array) -> pa.Array:
    """PostgreSQL's text of a guarded column: the guard's text where it holds one, else the
    native value as PostgreSQL prints it (``printed``, computed on the others only)."""
    return pc.if_else(pc.is_valid(guard), guard, printed)


# --- ZonedTimestamp text of UTC microseconds (numpy gathers from small tables) -----------

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


def _timestamptz(conv: ColumnConverter, values: pa.Array, guard: pa.Array) -> Converted:
    assert isinstance(conv, TimestampTzConverter)
    outside = guard.null_count < len(guard)
    if outside:  # only rows the guard leaves NULL are valid native values
        naive = pc.if_else(pc.is_valid(guard), pa.scalar(None, pa.timestamp("us")),
                           pc.cast(values, pa.timestamp("us")))
        # "YYYY-MM-DD HH:MM:SS.ffffff+00", six fraction digits whatever the value
        printed = pc.binary_join_element_wise(pc.cast(naive, pa.string()), "+00", "")
        return fast_convert(conv, _guarded_text(values, guard, printed))
    micros = pc.cast(values, pa.int64())
    null = np.asarray(micros.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    raw = micros.fill_null(0).to_numpy(zero_copy_only=False)
    bronze = _zoned_strings(raw, null, conv.width)
    return _finish(conv, bronze, pc.cast(values, pa.timestamp("us", tz="UTC")))


def _date(conv: ColumnConverter, values: pa.Array, guard: pa.Array) -> Converted:
    if guard.null_count < len(guard):
        masked = pc.if_else(pc.is_valid(guard), pa.scalar(None, pa.date32()), values)
        return fast_convert(conv, _guarded_text(values, guard, pc.cast(masked, pa.string())))
    silver = pc.cast(values, pa.date32())
    return _finish(conv, silver.view(pa.int32()), silver)


def convert_column(conv: ColumnConverter, kind: str | None, values: pa.Array,
                   guard: pa.Array | None = None) -> Converted:
    """``(bronze, silver)`` of one column of a batch; ``kind`` from :func:`native_kind`
    (None: the column was selected as text); ``guard``: its guard column."""
    if kind is None or kind == "text":
        return fast_convert(conv, _text(values))
    if kind == "bool":
        return _finish(conv, values, values)
    if kind in ("int", "float"):
        bronze = pc.cast(values, conv.bronze_field.type)
        same = conv.silver_field.type == bronze.type
        return _finish(conv, bronze, bronze if same else None)
    assert guard is not None
    if kind == "timestamptz":
        return _timestamptz(conv, values, guard)
    if kind == "date":
        return _date(conv, values, guard)
    raise ValueError(f"unknown native kind {kind!r}")


def convert_batch(converters: Sequence[ColumnConverter], kinds: Sequence[str | None],
                  batch: pa.RecordBatch) -> list[Converted]:
    """Every column's ``(bronze, silver)`` of a batch of :func:`arrow_select`'s query."""
    out: list[Converted] = []
    at = 0
    for conv, kind in zip(converters, kinds, strict=True):
        values = batch.column(at)
        guard = batch.column(at + 1) if kind in GUARDED else None
        at += 2 if kind in GUARDED else 1
        out.append(convert_column(conv, kind, values, guard))
    return out
