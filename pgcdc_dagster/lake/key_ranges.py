"""Which data files can hold a batch's keys, from the files' Delta min/max statistics.

Works for every key type whose statistics are comparable (``lake/file_stats.py``):
integers, booleans, strings (uuids are strings in silver), dates, timestamps and decimals.
A composite key prunes on each of its columns: a file is a candidate when one batch key lies
within the file's range on every key column that has statistics (a file sorted by the key
tuple has one range per column, and a key outside any of them is not in the file).

Statistics are bounds, never trusted to be exact:

* a string bound may be a cut prefix (this project and Delta cut at 32 characters; a cut
  maximum may end with a character from the last Unicode planes, Delta's convention, which
  delta-rs reads back as U+FFFFF): a key ``k`` is within ``high`` when ``k`` cut to
  ``high``'s length (less such a final character) is not above it, which every key not above
  the uncut maximum satisfies;
* a timestamp maximum may have been cut to milliseconds by another writer: one millisecond
  is added to it;
* a file without statistics for a key column (older files, values over 4 KiB whose Parquet
  statistics are dropped, float keys) is not pruned on that column.

A batch with a NULL key keeps every file (``IS NOT DISTINCT FROM`` keys; rare).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

CUT_MARK = "\U000f0000"
"""A string maximum's final character at or above this (planes 15-16) marks a cut value."""
_UNIT_PER_MS = {"s": 1, "ms": 1, "us": 1000, "ns": 1_000_000}

Range = tuple[Any, Any]


def comparable(values: pa.Array | pa.ChunkedArray, typ: pa.DataType) -> pa.Array | None:
    """``values`` cast to the key type ``typ``, in a form whose order is the key's order
    (timestamps and dates as integers); None for a type files are not pruned on, or values
    that do not cast (statistics of another type: not pruned on either)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    try:
        return _comparable(values, typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def _comparable(values: pa.Array, typ: pa.DataType) -> pa.Array | None:
    if pa.types.is_boolean(typ) or pa.types.is_integer(typ):
        return pc.cast(values, pa.int64())
    if pa.types.is_timestamp(typ):
        return pc.cast(pc.cast(values, typ), pa.int64())
    if pa.types.is_date32(typ):
        return pc.cast(pc.cast(pc.cast(values, typ), pa.int32()), pa.int64())
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return pc.cast(values, pa.string())
    if pa.types.is_decimal(typ):
        return pc.cast(values, typ)
    return None


def file_ranges(lows: pa.Array | None, highs: pa.Array | None, typ: pa.DataType
                ) -> list[Range]:
    """Per file, ``(low, high)`` of one key column from the log's statistics (comparable
    values, the high widened as the module docstring says); ``(None, None)`` when
    unknown."""
    low = comparable(lows, typ) if lows is not None else None
    high = comparable(highs, typ) if highs is not None else None
    if low is None or high is None:
        n = len(lows) if lows is not None else len(highs) if highs is not None else 0
        return [(None, None)] * n
    if pa.types.is_timestamp(typ):
        high = pc.add(high, _UNIT_PER_MS[typ.unit])
    return list(zip(low.to_pylist(), high.to_pylist(), strict=True))


def candidates(ranges: Sequence[Sequence[Range]], keys: Sequence[pa.Array | pa.ChunkedArray],
               types: Sequence[pa.DataType]) -> list[bool]:
    """Per file (``ranges[file][key column]``), whether it can hold one of the batch's keys
    (``keys``: the batch's key columns, ``types``: the stored key types)."""
    columns = [comparable(k, t) for k, t in zip(keys, types, strict=True)]
    if not ranges:
        return []
    if not len(keys[0]) or columns[0] is None or any(k.null_count for k in keys):
        return [True] * len(ranges)
    order = pc.sort_indices(columns[0])
    first = columns[0].take(order).to_pylist()
    rest = [(i, c.take(order)) for i, c in enumerate(columns) if i and c is not None]
    return [_holds(r, first, rest) for r in ranges]


def _holds(ranges: Sequence[Range], first: list[Any],
           rest: Sequence[tuple[int, pa.Array]]) -> bool:
    low, high = ranges[0]
    if low is None or high is None:
        return True
    start = bisect.bisect_left(first, low)
    if isinstance(high, str):
        cut = _cut(high)
        stop = bisect.bisect_right(first, cut, lo=start, key=lambda k: k[:len(cut)])
    else:
        stop = bisect.bisect_right(first, high, lo=start)
    if start >= stop:
        return False
    mask: pa.Array | None = None
    for i, column in rest:
        lo, hi = ranges[i]
        if lo is None or hi is None:
            continue
        part = column.slice(start, stop - start)
        if isinstance(hi, str):
            cut = _cut(hi)
            within = pc.and_(pc.greater_equal(part, lo),
                             pc.less_equal(pc.utf8_slice_codeunits(part, 0, len(cut)), cut))
        else:
            within = pc.and_(pc.greater_equal(part, lo), pc.less_equal(part, hi))
        mask = within if mask is None else pc.and_(mask, within)
    return mask is None or bool(pc.any(mask).as_py())


def _cut(high: str) -> str:
    """A string maximum without its cut mark (module docstring)."""
    return high[:-1] if high and high[-1] >= CUT_MARK else high
