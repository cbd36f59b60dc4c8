"""INTERVAL under ``interval.handling.mode`` (CFG-42, seed-inventory §5.1, D-02).

Input is PostgreSQL's default ``IntervalStyle = postgres`` output, e.g.
``1 year 2 mons 3 days 04:05:06.78`` or ``-1 days +02:03:00``.

Bronze, as Debezium computes it from PgJDBC's ``PGInterval``:
- ``numeric``: INT64 ``io.debezium.time.MicroDuration``, ``MicroDuration.durationMicros``'s
  formula with ``365.25 / 12`` days per month (so ``1 mon`` -> 2629800000000), evaluated in
  integers: a month is exactly 2,629,800 s, so the sum is exact to the microsecond where
  Debezium's doubles lose it (``00:00:01.000001`` is 1000001 here, 1000000 there).
- ``string``: STRING ``io.debezium.time.Interval``, ``P<y>Y<m>M<d>DT<h>H<min>M<s>S`` with the
  seconds as ``BigDecimal.valueOf(seconds).stripTrailingZeros().toPlainString()`` prints them
  (seed example: ``P1Y2M3DT4H5M6.78S``), written from the whole seconds and microseconds.
  A negative time part makes hours, minutes and seconds negative.

Silver: ``struct<months int32, days int32, microseconds int64>`` (Delta has no interval
type), decoded from bronze: exact, as PostgreSQL stores it, in ``string`` mode; in ``numeric``
mode only Debezium's approximate microseconds exist, so months and days are 0 there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_DOWN, Decimal

import pyarrow as pa

from pgcdc_dagster.cdc.typeconv.base import BaseConverter, map_values
from pgcdc_dagster.cdc.typeconv.model import PgType, TypeModes
from pgcdc_dagster.cdc.typeconv.schema import primitive

MICROS_PER_MONTH_AVG = 2_629_800_000_000
"""Debezium's average month (365.25 / 12 = 30.4375 days) in microseconds: a whole number."""
MICROS_PER_DAY = 86_400_000_000
SILVER_TYPE = pa.struct([
    pa.field("months", pa.int32(), False),
    pa.field("days", pa.int32(), False),
    pa.field("microseconds", pa.int64(), False),
])
_UNIT = re.compile(r"([+-]?\d+) (year|years|mon|mons|day|days)\b")
_TIME = re.compile(r"([+-]?)(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?")


@dataclass(frozen=True, slots=True)
class IntervalParts:
    """The fields of a postgres-style interval text, as PGInterval holds them."""

    years: int = 0
    months: int = 0
    days: int = 0
    hours: int = 0
    minutes: int = 0
    whole_seconds: int = 0
    micros: int = 0

    def seconds_text(self) -> str:
        """``PGInterval.getSeconds()`` as ``BigDecimal.valueOf(..).stripTrailingZeros()
        .toPlainString()`` prints it (``6.78``, ``-0.000001``, ``0``), from the integers."""
        total = self.whole_seconds * 1_000_000 + self.micros
        sign = "-" if total < 0 else ""
        whole, frac = divmod(abs(total), 1_000_000)
        return f"{sign}{whole}" + (f".{frac:06d}".rstrip("0") if frac else "")

    def duration_micros(self) -> int:
        """``MicroDuration.durationMicros`` with the 365.25/12 average, in exact integers
        (saturating at the int64 limits like Java's ``(long)`` cast)."""
        micros = ((self.years * 12 + self.months) * MICROS_PER_MONTH_AVG
                  + self.days * MICROS_PER_DAY
                  + ((self.hours * 60 + self.minutes) * 60 + self.whole_seconds) * 1_000_000
                  + self.micros)
        return max(min(micros, 2**63 - 1), -(2**63))

    def iso_string(self) -> str:
        """``Interval.toIsoString``: ``P1Y2M3DT4H5M6.78S``."""
        return (f"P{self.years}Y{self.months}M{self.days}DT{self.hours}H{self.minutes}M"
                f"{self.seconds_text()}S")

    def exact(self) -> dict[str, int]:
        """PostgreSQL's own representation: months, days and microseconds."""
        micros = ((self.hours * 60 + self.minutes) * 60 + self.whole_seconds) * 1_000_000 \
            + self.micros
        return {"months": self.years * 12 + self.months, "days": self.days,
                "microseconds": micros}


def parse_interval(text: str) -> IntervalParts:
    """Parse ``IntervalStyle = postgres`` output."""
    fields = {"years": 0, "months": 0, "days": 0}
    for number, unit in _UNIT.findall(text):
        key = {"y": "years", "m": "months", "d": "days"}[unit[0]]
        fields[key] = int(number)
    hours = minutes = seconds = micros = 0
    m = _TIME.search(text)
    if m is not None:
        sign = -1 if m.group(1) == "-" else 1
        hours, minutes, seconds = (sign * int(m.group(i)) for i in (2, 3, 4))
        micros = sign * int((m.group(5) or "").ljust(6, "0"))
    elif not _UNIT.search(text):
        raise ValueError(f"not a postgres-style interval: {text!r} (IntervalStyle must be "
                         "'postgres')")
    return IntervalParts(fields["years"], fields["months"], fields["days"], hours, minutes,
                         seconds, micros)


class IntervalConverter(BaseConverter):
    """INTERVAL -> MicroDuration (numeric) or Interval (string); silver exact struct."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        self.as_string = modes.interval == "string"
        schema = (primitive("string", "io.debezium.time.Interval") if self.as_string
                  else primitive("int64", "io.debezium.time.MicroDuration"))
        super().__init__(column, pgtype, typmod, modes, nullable, schema, SILVER_TYPE)

    def _fallback_value(self) -> object:
        return "P0Y0M0DT0H0M0S" if self.as_string else 0

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        if self.as_string:
            return map_values(text, lambda v: parse_interval(v).iso_string(), pa.string())
        return map_values(text, lambda v: parse_interval(v).duration_micros(), pa.int64())

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        items = values.to_pylist()
        zero = {"months": 0, "days": 0, "microseconds": 0}
        if self.as_string:
            rows = [zero if v is None else parse_iso_interval(v) for v in items]
        else:
            rows = [{"months": 0, "days": 0, "microseconds": v or 0} for v in items]
        mask = pa.array([v is None for v in items], type=pa.bool_())
        flat = pa.array(rows, type=SILVER_TYPE)
        return pa.StructArray.from_arrays(flat.flatten(), fields=list(SILVER_TYPE), mask=mask)


_ISO = re.compile(r"^P(-?\d+)Y(-?\d+)M(-?\d+)DT(-?\d+)H(-?\d+)M(-?[\d.]+)S$")


def parse_iso_interval(text: str) -> dict[str, int]:
    """An ``io.debezium.time.Interval`` string -> months, days, microseconds (exact)."""
    m = _ISO.match(text)
    if m is None:
        raise ValueError(f"not a Debezium Interval: {text!r}")
    years, months, days, hours, minutes = (int(m.group(i)) for i in range(1, 6))
    micros = int(Decimal(m.group(6)).scaleb(6).to_integral_value(rounding=ROUND_DOWN))
    return {"months": years * 12 + months, "days": days,
            "microseconds": (hours * 3600 + minutes * 60) * 1_000_000 + micros}
