"""Per-value parsing and formatting of PostgreSQL's ISO date/time text (the slow path).

The vectorised paths in ``temporal.py`` handle ordinary values; these functions handle what
Arrow's parser cannot: BC dates (``0044-03-15 BC``), years past 9999, UTC offsets with
seconds (``+00:53:28`` for historical local mean time), ``24:00:00`` and infinities.
All arithmetic is on the proleptic Gregorian calendar, as PostgreSQL and java.time use.
"""

from __future__ import annotations

import re

MICROS_PER_DAY = 86_400_000_000
# Debezium / PgJDBC PGStatement.DATE_POSITIVE_INFINITY and DATE_NEGATIVE_INFINITY (TYPE-05).
POSITIVE_INFINITY_MICROS = 9_223_372_036_825_200_000
NEGATIVE_INFINITY_MICROS = -9_223_372_036_832_400_000

_DATE = re.compile(r"^(\d+)-(\d\d)-(\d\d)")
_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
_OFFSET = re.compile(r"([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?$")


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year numbering)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """Inverse of :func:`days_from_civil`: (year, month, day), astronomical years."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def parse_date_days(text: str) -> int:
    """``YYYY-MM-DD[ BC]`` -> days since the epoch."""
    m = _DATE.match(text)
    if m is None:
        raise ValueError(f"not a PostgreSQL ISO date: {text!r}")
    year = int(m.group(1))
    if text.endswith(" BC"):
        year = 1 - year
    return days_from_civil(year, int(m.group(2)), int(m.group(3)))


def parse_time_micros(text: str) -> int:
    """``HH:MM:SS[.ffffff]`` (hour may be 24) -> microseconds past midnight."""
    m = _TIME.match(text)
    if m is None:
        raise ValueError(f"not a PostgreSQL time: {text!r}")
    frac = (m.group(4) or "").ljust(6, "0")
    seconds = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))
    return seconds * 1_000_000 + int(frac or 0)


def parse_offset_seconds(text: str) -> int:
    """The trailing UTC offset ``+HH[:MM[:SS]]`` of a time/timestamp text, in seconds."""
    m = _OFFSET.search(text.removesuffix(" BC"))
    if m is None:
        raise ValueError(f"no UTC offset in {text!r}")
    secs = int(m.group(2)) * 3600 + int(m.group(3) or 0) * 60 + int(m.group(4) or 0)
    return -secs if m.group(1) == "-" else secs


def parse_timestamp_micros(text: str, *, with_zone: bool) -> int:
    """A PostgreSQL ISO timestamp[tz] text -> microseconds since the epoch (UTC).

    ``infinity`` / ``-infinity`` map to Debezium's infinity values (TYPE-05).
    """
    if text == "infinity":
        return POSITIVE_INFINITY_MICROS
    if text == "-infinity":
        return NEGATIVE_INFINITY_MICROS
    date_part, _, rest = text.partition(" ")
    days = parse_date_days(date_part + (" BC" if text.endswith(" BC") else ""))
    micros = days * MICROS_PER_DAY + parse_time_micros(rest)
    if with_zone:
        micros -= parse_offset_seconds(text) * 1_000_000
    return micros


def java_year(year: int) -> str:
    """A year as java.time's ISO formatter prints it (``+10000``, ``-0044``, ``0999``)."""
    if year > 9999:
        return f"+{year}"
    if year < 0:
        return f"-{-year:04d}"
    return f"{year:04d}"


def java_fraction(micros: int, width: int | None) -> str:
    """Fraction of a second: exactly ``width`` digits, or minimal digits when None."""
    if width is not None:
        return "." + f"{micros:06d}"[:width] if width > 0 else ""
    if micros == 0:
        return ""
    return "." + f"{micros:06d}".rstrip("0")


def iso_utc_timestamp(micros: int, width: int | None) -> str:
    """Epoch microseconds -> ``YYYY-MM-DDTHH:MM:SS[.f]Z`` as Debezium's ZonedTimestamp."""
    days, rem = divmod(micros, MICROS_PER_DAY)
    year, month, day = civil_from_days(days)
    secs, frac = divmod(rem, 1_000_000)
    hh, mm, ss = secs // 3600, secs // 60 % 60, secs % 60
    return (f"{java_year(year)}-{month:02d}-{day:02d}T{hh:02d}:{mm:02d}:{ss:02d}"
            f"{java_fraction(frac, width)}Z")


def iso_time(micros_of_day: int) -> str:
    """Microseconds past midnight -> ``HH:MM:SS[.f]`` with minimal fraction digits."""
    secs, frac = divmod(micros_of_day, 1_000_000)
    return (f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
            f"{java_fraction(frac, None)}")


_ISO = re.compile(r"^([+-]?\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z$")


def parse_iso_utc_micros(text: str) -> int:
    """A ZonedTimestamp string (``[+-]YYYY-MM-DDTHH:MM:SS[.f]Z`` or ``[-]infinity``) ->
    epoch microseconds, with Debezium's infinity values."""
    if text == "infinity":
        return POSITIVE_INFINITY_MICROS
    if text == "-infinity":
        return NEGATIVE_INFINITY_MICROS
    m = _ISO.match(text)
    if m is None:
        raise ValueError(f"not a ZonedTimestamp: {text!r}")
    days = days_from_civil(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    secs = int(m.group(4)) * 3600 + int(m.group(5)) * 60 + int(m.group(6))
    frac = int((m.group(7) or "")[:6].ljust(6, "0"))
    return days * MICROS_PER_DAY + secs * 1_000_000 + frac
