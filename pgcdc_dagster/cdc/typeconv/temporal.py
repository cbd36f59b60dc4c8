"""DATE, TIME, TIMESTAMP, TIMESTAMPTZ and TIMETZ (seed-inventory §5.1, §5.2; TYPE-03..07).

Bronze by ``time.precision.mode`` (precision P from the typmod; no typmod means 6):

============  =====================================  ====================================
type          adaptive / adaptive_time_microseconds  connect
============  =====================================  ====================================
DATE          INT32 io.debezium.time.Date (days)     INT32 org.apache.kafka.connect.data.Date
TIME(P<=3)    INT32 io.debezium.time.Time (ms);      INT32 org.apache.kafka.connect.data.Time
              a_t_m: INT64 io.debezium.time.MicroTime  (ms; Kafka's Time is INT32, see D-24)
TIME(P>3)     INT64 io.debezium.time.MicroTime (us)  as above
TIMESTAMP     P<=3: INT64 io.debezium.time.Timestamp INT64 org.apache.kafka.connect.data.
              (ms); else MicroTimestamp (us)          Timestamp (ms)
============  =====================================  ====================================

TIMESTAMP is read as UTC (TYPE-04); ``+-infinity`` become 9223372036825200000 /
-9223372036832400000 microseconds (TYPE-05; milliseconds: those divided by 1000).
TIMESTAMPTZ -> STRING io.debezium.time.ZonedTimestamp: the instant in UTC, ISO-8601 with ``Z``
and exactly P fraction digits (Debezium formats with the column's fractional width; P=0 prints
none); infinities stay ``infinity`` / ``-infinity``. TIMETZ -> STRING io.debezium.time.ZonedTime,
shifted to UTC, ``HH:MM:SS[.f]Z`` with minimal fraction digits.

Silver: DATE -> date32; TIME -> string ``HH:MM:SS[.f]`` with exactly P fraction digits (Delta
has no TIME type; fixed width, so it sorts as time; ``24:00:00`` kept); TIMESTAMP ->
timestamp('us') (no zone);
TIMESTAMPTZ -> timestamp('us', tz='UTC'); TIMETZ -> string, the UTC ``HH:MM:SS[.f]Z`` form of
bronze (Delta has no time-with-zone type; the original offset is not kept by Debezium either).
Silver is decoded from bronze, so ``connect`` mode (milliseconds) is as coarse there.
Infinities are clamped to 0001-01-01 / 9999-12-31 23:59:59.999999 (the Delta/Spark range),
as are values outside it. DATE infinities in bronze are Debezium's epoch days of its infinity
dates (-5877611-06-21 for ``infinity``, -5877611-06-22 for ``-infinity``).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.typeconv import calendar as cal
from pgcdc_dagster.cdc.typeconv.base import BaseConverter, map_values, patch
from pgcdc_dagster.cdc.typeconv.fixed_text import zoned_utc_text
from pgcdc_dagster.cdc.typeconv.model import PgType, TypeModes
from pgcdc_dagster.cdc.typeconv.schema import ConnectSchema, primitive

_TS = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?"
FAST_TIMESTAMP = _TS + "$"
FAST_TIMESTAMPTZ = _TS + r"[+-]\d\d(:\d\d)?$"
FAST_DATE = r"^\d{4}-\d\d-\d\d$"
FAST_TIME = r"^\d\d:\d\d:\d\d(\.\d{1,6})?$"
FAST_ZONED = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$"
SILVER_MAX_MICROS = cal.days_from_civil(10000, 1, 1) * cal.MICROS_PER_DAY - 1
SILVER_MIN_MICROS = cal.days_from_civil(1, 1, 1) * cal.MICROS_PER_DAY
SILVER_MAX_DAYS = cal.days_from_civil(9999, 12, 31)
SILVER_MIN_DAYS = cal.days_from_civil(1, 1, 1)
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def time_precision(typmod: int) -> int:
    """Fractional-second precision of a time/timestamp typmod (PgJDBC: 6 when absent)."""
    return 6 if typmod < 0 else typmod


def floor_div(values: pa.Array, divisor: int) -> pa.Array:
    """Integer floor division (Arrow's ``divide`` truncates toward zero)."""
    q = pc.divide(values, divisor)
    r = pc.subtract(values, pc.multiply(q, divisor))
    return pc.if_else(pc.less(r, 0), pc.subtract(q, 1), q)


def _not_fast(text: pa.StringArray, pattern: str) -> pa.Array:
    return pc.and_(pc.is_valid(text), pc.invert(pc.match_substring_regex(text, pattern)))


def saturated_int64(value: int) -> int:
    """``value`` limited to the int64 range, as ``java.util.concurrent.TimeUnit`` converts
    (Debezium's epoch microseconds): PostgreSQL's timestamps run to 294276 AD, about 29
    years past 2^63 microseconds after 1970."""
    return max(INT64_MIN, min(INT64_MAX, value))


def timestamp_micros(text: pa.StringArray, *, with_zone: bool) -> pa.Int64Array:
    """Text -> epoch microseconds (UTC), vectorised with a per-value path for odd values
    (saturated at the int64 range: :func:`saturated_int64`)."""
    pattern = FAST_TIMESTAMPTZ if with_zone else FAST_TIMESTAMP
    slow = _not_fast(text, pattern)
    fast_text = pc.if_else(slow, pa.scalar(None, pa.string()), text)
    target = pa.timestamp("us", tz="UTC") if with_zone else pa.timestamp("us")
    fast = pc.cast(pc.cast(fast_text, target), pa.int64())
    out = patch(fast, text, slow, lambda v: saturated_int64(
        cal.parse_timestamp_micros(v, with_zone=with_zone)))
    assert isinstance(out, pa.Int64Array)
    return out


def clamp_silver_micros(micros: pa.Array) -> pa.Array:
    """Clamp to the Delta/Spark timestamp range (infinities and years past 9999)."""
    low = pc.max_element_wise(micros, SILVER_MIN_MICROS, skip_nulls=False)
    return pc.min_element_wise(low, SILVER_MAX_MICROS, skip_nulls=False)


class DateConverter(BaseConverter):
    """DATE -> INT32 days since the epoch; silver date32 (TYPE-06: 2018-06-20 -> 17702)."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        name = ("org.apache.kafka.connect.data.Date" if modes.time_precision == "connect"
                else "io.debezium.time.Date")
        super().__init__(column, pgtype, typmod, modes, nullable,
                         primitive("int32", name), pa.date32())

    def _days(self, text: pa.StringArray) -> pa.Array:
        slow = _not_fast(text, FAST_DATE)
        fast_text = pc.if_else(slow, pa.scalar(None, pa.string()), text)
        fast = pc.cast(pc.cast(fast_text, pa.date32()), pa.int32())
        return patch(fast, text, slow, _date_days)

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        return self._days(text)

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        days = pc.cast(values, pa.int64())
        infinite = pc.less(days, SILVER_MIN_DAYS - 10**9)
        pos = pc.equal(days, POSITIVE_INFINITY_DAYS)
        days = pc.if_else(pc.and_(infinite, pos), SILVER_MAX_DAYS, days)
        low = pc.max_element_wise(days, SILVER_MIN_DAYS, skip_nulls=False)
        days = pc.min_element_wise(low, SILVER_MAX_DAYS, skip_nulls=False)
        return pc.cast(pc.cast(days, pa.int32()), pa.date32())


# Debezium maps the date infinities to PostgresValueConverter.POSITIVE_INFINITY_LOCAL_DATE
# (-5877611-06-21) and NEGATIVE_INFINITY_LOCAL_DATE (-5877611-06-22); these are their epoch days.
POSITIVE_INFINITY_DAYS = cal.days_from_civil(-5877611, 6, 21)
NEGATIVE_INFINITY_DAYS = cal.days_from_civil(-5877611, 6, 22)


def _date_days(text: str) -> int:
    """Days of a date text, with Debezium's values for ``infinity`` / ``-infinity``."""
    if text == "infinity":
        return POSITIVE_INFINITY_DAYS
    if text == "-infinity":
        return NEGATIVE_INFINITY_DAYS
    return cal.parse_date_days(text)


class TimeConverter(BaseConverter):
    """TIME(P) -> Time (ms, INT32) or MicroTime (us, INT64) per mode; silver ISO text."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        p = time_precision(typmod)
        mode = modes.time_precision
        self.millis = mode == "connect" or (mode == "adaptive" and p <= 3)
        if mode == "connect":
            schema = primitive("int32", "org.apache.kafka.connect.data.Time")
        elif self.millis:
            schema = primitive("int32", "io.debezium.time.Time")
        else:
            schema = primitive("int64", "io.debezium.time.MicroTime")
        self.digits = p
        super().__init__(column, pgtype, typmod, modes, nullable, schema, pa.string())

    def _micros(self, text: pa.StringArray) -> pa.Array:
        """``HH:MM:SS[.ffffff]`` -> microseconds, vectorised by fixed positions."""
        slow = _not_fast(text, FAST_TIME)
        fast_text = pc.if_else(slow, pa.scalar(None, pa.string()), text)

        def part(start: int, stop: int) -> pa.Array:
            return pc.cast(pc.utf8_slice_codeunits(fast_text, start, stop), pa.int64())

        seconds = pc.add(pc.multiply(pc.add(pc.multiply(part(0, 2), 60), part(3, 5)), 60),
                         part(6, 8))
        frac = pc.cast(pc.utf8_rpad(pc.utf8_slice_codeunits(fast_text, 9, 15), 6, "0"),
                       pa.int64())
        fast = pc.add(pc.multiply(seconds, 1_000_000), frac)
        return patch(fast, text, slow, cal.parse_time_micros)

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        micros = self._micros(text)
        if self.millis:
            return pc.cast(pc.divide(micros, 1000), pa.int32())
        return micros

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        micros = pc.cast(values, pa.int64())
        if self.millis:
            micros = pc.multiply(micros, 1000)

        def two(v: pa.Array) -> pa.Array:
            return pc.utf8_lpad(pc.cast(v, pa.string()), 2, "0")

        secs = pc.divide(micros, 1_000_000)
        parts = [two(pc.divide(secs, 3600)), ":", two(pc.remainder(pc.divide(secs, 60), 60)),
                 ":", two(pc.remainder(secs, 60))]
        if self.digits > 0:
            frac = pc.utf8_lpad(pc.cast(pc.remainder(micros, 1_000_000), pa.string()), 6, "0")
            parts += [".", pc.utf8_slice_codeunits(frac, 0, self.digits)]
        return pc.binary_join_element_wise(*parts, "")


class TimestampConverter(BaseConverter):
    """TIMESTAMP(P) -> Timestamp / MicroTimestamp / connect Timestamp; silver timestamp('us')."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        p = time_precision(typmod)
        mode = modes.time_precision
        self.millis = mode == "connect" or p <= 3
        if mode == "connect":
            name = "org.apache.kafka.connect.data.Timestamp"
        elif self.millis:
            name = "io.debezium.time.Timestamp"
        else:
            name = "io.debezium.time.MicroTimestamp"
        super().__init__(column, pgtype, typmod, modes, nullable, primitive("int64", name),
                         pa.timestamp("us"))

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        micros = timestamp_micros(text, with_zone=False)
        return floor_div(micros, 1000) if self.millis else micros

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        micros = pc.multiply(values, 1000) if self.millis else values
        return pc.cast(clamp_silver_micros(micros), pa.timestamp("us"))


class TimestampTzConverter(BaseConverter):
    """TIMESTAMPTZ -> STRING io.debezium.time.ZonedTimestamp; silver timestamp('us', UTC)."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        p = time_precision(typmod)
        self.width: int | None = p if p > 0 else None
        super().__init__(column, pgtype, typmod, modes, nullable,
                         primitive("string", "io.debezium.time.ZonedTimestamp"),
                         pa.timestamp("us", tz="UTC"))

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        if isinstance(text, pa.StringArray):  # canonical UTC output: one numpy gather
            fast = zoned_utc_text(text, self.width)
            if fast is not None:
                return fast
        return self.bronze_general(text)

    def bronze_general(self, text: pa.StringArray) -> pa.Array:
        """The general path: any PostgreSQL output (offsets, BC years, infinities)."""
        micros = timestamp_micros(text, with_zone=True)
        # Formatting a zone-less timestamp is fast in Arrow; the instant is already UTC.
        naive = pc.cast(micros, pa.timestamp("us"))
        if self.width is None:
            naive = pc.cast(naive, pa.timestamp("s"), safe=False)
        body = pc.replace_substring(pc.cast(naive, pa.string()), " ", "T", max_replacements=1)
        if self.width is not None and self.width < 6:
            body = pc.utf8_slice_codeunits(body, 0, -(6 - self.width))
        fast = pc.binary_join_element_wise(body, "Z", "")
        odd = pc.or_(_not_fast(text, r"^\d{4}-"),
                     pc.or_(pc.less(micros, SILVER_MIN_MICROS),
                            pc.greater(micros, SILVER_MAX_MICROS)))
        return patch(fast, text, odd, self._slow)

    def _slow(self, text: str) -> str:
        if text in ("infinity", "-infinity"):
            return text
        return cal.iso_utc_timestamp(cal.parse_timestamp_micros(text, with_zone=True),
                                     self.width)

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        slow = _not_fast(values, FAST_ZONED)
        fast_text = pc.if_else(slow, pa.scalar(None, pa.string()), values)
        fast = pc.cast(pc.cast(fast_text, pa.timestamp("us", tz="UTC")), pa.int64())
        micros = patch(fast, values, slow,
                       lambda v: saturated_int64(cal.parse_iso_utc_micros(v)))
        return pc.cast(clamp_silver_micros(micros), pa.timestamp("us", tz="UTC"))

    def bronze_placeholder(self) -> pa.Scalar | None:
        """Fixed width: never TOASTed."""
        return None

    def _fallback_value(self) -> object:
        return "1970-01-01T00:00:00Z"


class TimeTzConverter(BaseConverter):
    """TIMETZ -> STRING io.debezium.time.ZonedTime in UTC; silver: the same UTC string."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        super().__init__(column, pgtype, typmod, modes, nullable,
                         primitive("string", "io.debezium.time.ZonedTime"), pa.string())

    @staticmethod
    def _zoned(text: str) -> str:
        local = cal.parse_time_micros(text)
        utc = local - cal.parse_offset_seconds(text) * 1_000_000
        # 24:00:00+00 wraps to 00:00:00Z, as Debezium 3.6 writes it (snapshot and stream).
        return cal.iso_time(utc % cal.MICROS_PER_DAY) + "Z"

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        return map_values(text, self._zoned, pa.string())

    def _fallback_value(self) -> object:
        return "00:00:00Z"



def schema_of(converter: BaseConverter) -> ConnectSchema:
    """The converter's Kafka Connect schema (for element schemas of arrays)."""
    return converter.schema
