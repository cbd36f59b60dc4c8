"""Delta file statistics (``add.stats``) of the Parquet files this project writes.

Min/max/null counts are recorded for the flat columns whose Delta type has comparable
statistics: integers, booleans, floats, strings (uuids are strings in silver), dates,
timestamps and decimals. They serve silver's file pruning (``lake/key_ranges.py``) on any
key type and the data skipping of every Delta reader, so each recorded value is a true
bound of the file's values:

* strings longer than :data:`STRING_PREFIX` characters are cut to that prefix; a cut maximum
  is followed by U+10FFFF (Delta's own convention), so it stays above every value with that
  prefix. Parquet drops the statistics of a column with a value over 4 KiB: they are then
  taken from the written data when the writer passes it (every file but the snapshot's);
* timestamps are written at millisecond precision (Delta's format), the minimum rounded
  down and the maximum rounded up;
* decimals are written as exact JSON numbers; floats as Parquet has them (NaN left out), none
  when a bound is infinite;
* binaries and nested values get none.

Every flat column should have statistics: delta-rs 1.6.6's pyarrow dataset (``DeltaTable.
to_pyarrow_table(filters=...)``, ``to_pyarrow_dataset``) takes a column missing from a file's
``minValues`` for all-null and skips the file for an equality filter on it (measured; its
DataFusion queries and Polars do not). Columns without statistics (binaries, a file with an
infinite float, a snapshot file with a string over 4 KiB) are filtered there with care.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

STRING_PREFIX = 32
"""Characters of a string statistic kept (Delta's default)."""
MAX_SUFFIX = "\U0010ffff"
"""Appended to a cut string maximum: above any character that can follow the prefix."""
_DECIMAL = "\x00decimal:"
_DECIMAL_TOKEN = re.compile(r'"\\u0000decimal:([-+0-9.eE]+)"')
_EPOCH = dt.datetime(1970, 1, 1)
_MICROS = {"s": 1_000_000, "ms": 1000, "us": 1, "ns": 0}


def has_stats(typ: pa.DataType) -> bool:
    """Whether a flat column of this Arrow type gets Delta min/max statistics."""
    return bool(pa.types.is_integer(typ) or pa.types.is_boolean(typ)
                or pa.types.is_floating(typ) or pa.types.is_string(typ)
                or pa.types.is_large_string(typ)
                or pa.types.is_date32(typ) or pa.types.is_timestamp(typ)
                or pa.types.is_decimal(typ))


def stats_columns(schema: pa.Schema) -> list[str]:
    """The top-level columns written with Parquet statistics (the ones Delta stats carry)."""
    return [f.name for f in schema if has_stats(f.type)]


def delta_stats(meta: pq.FileMetaData, num_records: int, data: pa.Table | None = None) -> str:
    """The ``add.stats`` JSON of a Parquet file from its footer, and from ``data`` (the rows
    written) for the string columns whose Parquet statistics were dropped (module
    docstring)."""
    schema = meta.schema.to_arrow_schema()
    types = {f.name: f.type for f in schema if has_stats(f.type)}
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        for ci in range(group.num_columns):
            col = group.column(ci)
            name = col.path_in_schema
            if name not in types or col.statistics is None or not col.statistics.has_min_max:
                continue
            lo, hi = col.statistics.min, col.statistics.max
            if pa.types.is_timestamp(types[name]):  # the stored integers (any time zone)
                lo, hi = col.statistics.min_raw, col.statistics.max_raw
            lows[name] = lo if name not in lows else min(lows[name], lo)
            highs[name] = hi if name not in highs else max(highs[name], hi)
            nulls[name] = nulls.get(name, 0) + int(col.statistics.null_count or 0)
    if data is not None:
        _dropped_strings(data, types, lows, highs, nulls)
    mins = {n: _bound(v, types[n], upper=False) for n, v in lows.items()}
    maxs = {n: _bound(v, types[n], upper=True) for n, v in highs.items()}
    text = json.dumps({"numRecords": num_records,
                       "minValues": {n: v for n, v in mins.items() if v is not None},
                       "maxValues": {n: v for n, v in maxs.items() if v is not None},
                       "nullCount": nulls})
    return _DECIMAL_TOKEN.sub(r"\1", text)


def _dropped_strings(data: pa.Table, types: dict[str, pa.DataType], lows: dict[str, Any],
                     highs: dict[str, Any], nulls: dict[str, int]) -> None:
    """Min/max of the string columns of ``data`` Parquet left without statistics."""
    for name, typ in types.items():
        if name in lows or name not in data.column_names or not (
                pa.types.is_string(typ) or pa.types.is_large_string(typ)):
            continue
        column = data.column(name)
        bounds = pc.min_max(column)
        if bounds["min"].is_valid and bounds["max"].is_valid:
            lows[name], highs[name] = bounds["min"].as_py(), bounds["max"].as_py()
            nulls[name] = column.null_count


def _bound(value: Any, typ: pa.DataType, *, upper: bool) -> Any:
    """``value`` as a Delta statistic that stays a bound (module docstring); None: none."""
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        if not isinstance(value, str):
            return None
        if len(value) <= STRING_PREFIX:
            return value
        return value[:STRING_PREFIX] + MAX_SUFFIX if upper else value[:STRING_PREFIX]
    if pa.types.is_timestamp(typ):
        return _timestamp(int(value), typ, upper=upper)
    if pa.types.is_date32(typ):
        return value.isoformat() if isinstance(value, dt.date) else None
    if pa.types.is_floating(typ):
        return float(value) if isinstance(value, int | float) and math.isfinite(value) \
            else None
    if pa.types.is_decimal(typ):
        return f"{_DECIMAL}{value}" if isinstance(value, Decimal) and value.is_finite() \
            else None
    return value


def _timestamp(raw: int, typ: pa.TimestampType, *, upper: bool) -> str | None:
    """A stored timestamp integer as Delta's millisecond text, rounded outwards."""
    unit = typ.unit
    if unit == "ns":
        micros = -(-raw // 1000) if upper else raw // 1000
    else:
        micros = raw * _MICROS[unit]
    millis = -(-micros // 1000) if upper else micros // 1000
    try:
        moment = _EPOCH + dt.timedelta(milliseconds=millis)
    except OverflowError:
        return None
    m = moment
    text = (f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:"
            f"{m.second:02d}.{m.microsecond // 1000:03d}")
    return f"{text}Z" if typ.tz is not None else text
