"""Expected silver values computed by PostgreSQL itself, independent of the converters.

The end-to-end type tests compare what silver holds (read back with delta-rs, and with Spark
reading the Delta table's files) with values fetched from PostgreSQL: psycopg2's typed values
or PostgreSQL-side expressions (``extract(epoch ...)``, ``::text``, ``trim_scale``). Nothing
here imports ``pgcdc_dagster.cdc``; the only rules applied on the test side are the ones
docs/types.md states for silver (clamping to the Delta/Spark timestamp range, TIME as
fixed-width text, Debezium's 365.25/12-day month for numeric intervals).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable

EPOCH = dt.datetime(1970, 1, 1)
MIN_US = (dt.datetime(1, 1, 1) - EPOCH) // dt.timedelta(microseconds=1)
MAX_US = (dt.datetime(9999, 12, 31, 23, 59, 59, 999999) - EPOCH) // dt.timedelta(microseconds=1)
MIN_DAY = (dt.date(1, 1, 1) - EPOCH.date()).days
MAX_DAY = (dt.date(9999, 12, 31) - EPOCH.date()).days


def epoch_text(column: str) -> str:
    """SQL: the exact epoch seconds of a date/timestamp/timestamptz/time value, as text
    (``Infinity`` / ``-Infinity`` for the infinities; PostgreSQL 14+ returns numeric)."""
    return f"extract(epoch from {column})::text"


def epoch_array_text(column: str) -> str:
    """SQL: ``epoch_text`` of every element of an array, in order, NULLs kept."""
    return (f"CASE WHEN {column} IS NULL THEN NULL ELSE ARRAY(SELECT extract(epoch from x)::text"
            f" FROM unnest({column}) WITH ORDINALITY u(x, o) ORDER BY o) END")


def micros(text: str | None, *, millis: bool = False) -> int | None:
    """Epoch seconds text → µs, clamped to silver's range (docs/types.md "Special values");
    ``millis``: truncated to milliseconds first (``time.precision.mode=connect``)."""
    if text is None:
        return None
    if text in ("Infinity", "-Infinity"):
        return MAX_US if text == "Infinity" else MIN_US
    us = int(Decimal(text) * 1_000_000)
    if millis:
        us = us // 1000 * 1000
    return max(MIN_US, min(MAX_US, us))


def days(text: str | None) -> int | None:
    """Epoch seconds text of a date → days since the epoch, clamped to silver's range."""
    if text is None:
        return None
    if text in ("Infinity", "-Infinity"):
        return MAX_DAY if text == "Infinity" else MIN_DAY
    return max(MIN_DAY, min(MAX_DAY, int(Decimal(text)) // 86400))


def time_text(text: str | None, precision: int, *, millis: bool = False) -> str | None:
    """Epoch seconds text of a TIME → silver's fixed-width ``HH:MM:SS[.f]`` (P digits)."""
    if text is None:
        return None
    us = int(Decimal(text) * 1_000_000)
    if millis:
        us = us // 1000 * 1000
    secs, frac = divmod(us, 1_000_000)
    h, rest = divmod(secs, 3600)
    out = f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return out + ("." + f"{frac:06d}"[:precision] if precision else "")


def interval_sql(column: str) -> str:
    """SQL: ``[months, days, microseconds]`` of an interval, exactly as PostgreSQL stores it."""
    return (f"CASE WHEN {column} IS NULL THEN NULL ELSE ARRAY["
            f"(extract(year from {column}) * 12 + extract(month from {column}))::bigint, "
            f"extract(day from {column})::bigint, "
            f"((extract(hour from {column}) * 3600 + extract(minute from {column}) * 60 "
            f"+ extract(second from {column})) * 1000000)::bigint] END")


def interval_struct(parts: Sequence[int] | None, mode: str) -> dict[str, int] | None:
    """Silver's interval struct for PostgreSQL's parts: exact under ``string``; under
    ``numeric`` Debezium's approximation (seeds: 365.25/12 days per month) as microseconds."""
    if parts is None:
        return None
    months, d, us = (int(p) for p in parts)
    if mode == "string":
        return {"months": months, "days": d, "microseconds": us}
    approx = months * 2_629_800_000_000 + d * 86_400_000_000 + us
    return {"months": 0, "days": 0, "microseconds": approx}


def norm(value: Any) -> Any:
    """A comparable form of a value read back from Delta (delta-rs or Spark) or psycopg2:
    NaN equal to NaN, datetimes as UTC µs, dates as epoch days, maps as sorted pairs, Spark
    rows as dicts, memoryviews/bytearrays as bytes."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return (value - EPOCH) // dt.timedelta(microseconds=1)
    if isinstance(value, dt.date):
        return (value - EPOCH.date()).days
    if isinstance(value, (memoryview, bytearray)):
        return bytes(value)
    if hasattr(value, "asDict"):
        return norm(value.asDict(recursive=True))
    if isinstance(value, Mapping):
        return {k: norm(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(x, tuple) and len(x) == 2 for x in value):
            return sorted((k, norm(v)) for k, v in value)  # a map read by pyarrow
        return [norm(v) for v in value]
    return value


def spark_rows(spark: Any, uri: str, key: str) -> dict[Any, dict[str, Any]]:
    """Live silver rows read by Spark from the Delta table's current files (no Delta jars:
    the file list comes from the Delta log via delta-rs), keyed by ``key``. Timestamps are
    read as UTC text (session time zone UTC), so no Python-side time zone applies."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType, TimestampType

    files = DeltaTable(uri).file_uris()
    df = (spark.read.option("datetimeRebaseMode", "CORRECTED")
          .option("int96RebaseMode", "CORRECTED").parquet(*files))
    df = df.filter(~F.col("__deleted"))
    cols = []
    for f in df.schema.fields:
        if isinstance(f.dataType, (TimestampType, TimestampNTZType)):
            cols.append(F.date_format(f.name, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS").alias(f.name))
        else:
            cols.append(F.col(f.name))
    out = {}
    for row in df.select(*cols).collect():
        d = row.asDict(recursive=True)
        for f in df.schema.fields:
            if isinstance(f.dataType, (TimestampType, TimestampNTZType)) and d[f.name]:
                d[f.name] = dt.datetime.fromisoformat(d[f.name])
            if isinstance(d[f.name], dict) and f.dataType.typeName() == "map":
                d[f.name] = sorted(d[f.name].items())
        out[d[key]] = d
    return out


def delta_rows(uri: str, key: str) -> dict[Any, dict[str, Any]]:
    """Live silver rows read back with delta-rs, keyed by ``key``."""
    table = DeltaTable(uri).to_pyarrow_table()
    rows = table.filter(pc.invert(table["__deleted"])).to_pylist()
    return {r[key]: r for r in rows}
