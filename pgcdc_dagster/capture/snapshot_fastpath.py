"""Column conversion for snapshots: the converter's bronze value and the silver value at once.

``fast_convert(conv, text)`` returns exactly ``(conv.to_bronze(text), conv.to_silver(text))``.

The generic path decodes silver from the bronze value (equal by the converters' contract,
``to_silver(t) == from_bronze(to_bronze(t))``, and cheaper than a second text conversion).

Snapshot text comes from sessions pinned to ``TimeZone = UTC`` and ISO dates
(``postgres/snapshot_read.SESSION_SETTINGS``), so most temporal and numeric values have one
canonical shape. For a few hot types (TIMESTAMPTZ, TIMESTAMP, DATE, NUMERIC(p,s)) a batch
whose every value has that shape is converted with a handful of vectorised string and cast
kernels instead of the converter's general path (regular expressions, per-value fallbacks);
any other batch, and any converter subclass (column mappers), takes the converter itself.
TIMESTAMPTZ, the costliest, works on the string buffers themselves (numpy): its bronze value
is the text with ``T`` for the space, the fraction padded to the column's precision and ``Z``
for ``+00``, a fixed-width string built by one gather.
``tests/integration/test_snapshot_fastpath.py`` checks the two agree, value for value, on
real PostgreSQL output.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.cdc.typeconv.decimal_codec import decimal_array_to_bytes
from pgcdc_dagster.cdc.typeconv.numeric import NumericConverter
from pgcdc_dagster.cdc.typeconv.temporal import (
    DateConverter,
    TimestampConverter,
    TimestampTzConverter,
    floor_div,
)

Fast = Callable[[ColumnConverter, pa.StringArray], "tuple[pa.Array, pa.Array] | None"]


def _all(mask: pa.Array) -> bool:
    """True when the mask holds for every non-null value."""
    return bool(pc.all(mask, skip_nulls=True, min_count=0).as_py())


def _char_at(text: pa.StringArray, pos: int, char: str) -> pa.Array:
    return pc.equal(pc.utf8_slice_codeunits(text, pos, pos + 1), char)


def _iso_utc(text: pa.StringArray, lo: int, hi: int) -> bool:
    """``YYYY-MM-DD HH:MM:SS[.f]``: 4-digit AD years (BC values end in `` BC``, longer)."""
    length = pc.utf8_length(text)
    return _all(pc.and_(pc.and_(pc.greater_equal(length, lo), pc.less_equal(length, hi)),
                        pc.and_(_char_at(text, 4, "-"), _char_at(text, 10, " "))))


def _string_parts(text: pa.StringArray
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint8],
                             npt.NDArray[np.bool_] | None]:
    """Start and end offsets of the valid values, the data bytes, and the validity mask."""
    buffers = text.buffers()
    n = len(text)
    offsets = np.frombuffer(buffers[1], dtype=np.int32, count=text.offset + n + 1)[text.offset:]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None and \
        buffers[2].size else np.zeros(1, dtype=np.uint8)
    starts, ends = offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64)
    valid: npt.NDArray[np.bool_] | None = None
    if text.null_count:
        valid = np.asarray(text.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        starts, ends = starts[valid], ends[valid]
    return starts, ends, data, valid


def _fixed_strings(rows: npt.NDArray[np.uint8], valid: npt.NDArray[np.bool_] | None,
                   n: int) -> pa.StringArray:
    """A string array of ``n`` values: the rows of ``rows`` (one per valid value) and nulls."""
    width = rows.shape[1]
    lengths = np.full(n, width, dtype=np.int32) if valid is None else \
        np.where(valid, width, 0).astype(np.int32)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    validity = None if valid is None else pa.array(valid, pa.bool_()).buffers()[1]
    out = pa.Array.from_buffers(pa.string(), n, [validity, pa.py_buffer(offsets),
                                                 pa.py_buffer(np.ascontiguousarray(rows))],
                                null_count=0 if valid is None else int(n - valid.sum()))
    assert isinstance(out, pa.StringArray)
    return out


_PLUS, _ZERO, _DASH, _SPACE, _COLON, _DOT = (ord(c) for c in "+0- :.")


def _timestamptz(conv: ColumnConverter, text: pa.StringArray) -> tuple[pa.Array, pa.Array] | None:
    """ISO output in UTC is ``YYYY-MM-DD HH:MM:SS[.f]+00`` (then `` BC`` for BC years, and
    ``infinity``): ending in ``+00`` with a 4-digit year is the whole canonical test.

    PostgreSQL prints 1 to 6 fraction digits (trailing zeros dropped, none for a whole
    second); bronze (``ZonedTimestamp``) has exactly the column's precision of them, none at
    precision 0.
    """
    assert isinstance(conv, TimestampTzConverter)
    width = conv.width or 0
    starts, ends, data, valid = _string_parts(text)
    lengths = ends - starts
    if not bool(np.all((lengths >= 22) & (lengths <= (23 + width if width else 22)))):
        return None
    if not bool(np.all((data[ends - 3] == _PLUS) & (data[ends - 2] == _ZERO)
                       & (data[ends - 1] == _ZERO) & (data[starts + 4] == _DASH)
                       & (data[starts + 7] == _DASH) & (data[starts + 10] == _SPACE)
                       & (data[starts + 13] == _COLON) & (data[starts + 16] == _COLON)
                       & ((lengths == 22) | (data[starts + 19] == _DOT)))):
        return None
    size = 20 + (width + 1 if width else 0)
    rows = np.empty((len(starts), size), dtype=np.uint8)
    rows[:, :19] = data[starts[:, None] + np.arange(19)]
    rows[:, 10] = ord("T")
    if width:
        rows[:, 19] = _DOT
        digits = np.arange(width)
        at = np.minimum(starts[:, None] + 20 + digits, len(data) - 1)
        rows[:, 20:20 + width] = np.where(digits < (lengths - 23)[:, None], data[at], _ZERO)
    rows[:, size - 1] = ord("Z")
    bronze = _fixed_strings(rows, valid, len(text))
    silver = pc.cast(bronze, pa.timestamp("us", tz="UTC"))
    return bronze, silver


def _timestamp(conv: ColumnConverter, text: pa.StringArray) -> tuple[pa.Array, pa.Array] | None:
    assert isinstance(conv, TimestampConverter)
    if not _iso_utc(text, 19, 26) or not _all(pc.invert(pc.ends_with(text, " BC"))):
        return None
    micros = pc.cast(pc.cast(text, pa.timestamp("us")), pa.int64())
    if not conv.millis:
        return micros, pc.cast(micros, pa.timestamp("us"))
    millis = floor_div(micros, 1000)  # silver keeps only what bronze keeps
    return millis, pc.cast(pc.multiply(millis, 1000), pa.timestamp("us"))


def _date(conv: ColumnConverter, text: pa.StringArray) -> tuple[pa.Array, pa.Array] | None:
    length = pc.utf8_length(text)
    if not _all(pc.and_(pc.equal(length, 10), _char_at(text, 4, "-"))):
        return None
    silver = pc.cast(text, pa.date32())
    return pc.cast(silver, pa.int32()), silver


def _numeric(conv: ColumnConverter, text: pa.StringArray) -> tuple[pa.Array, pa.Array] | None:
    assert isinstance(conv, NumericConverter)
    target = conv.silver_field.type
    if conv.mode != "precise" or conv.ps is None or conv.ps[1] < 0 or \
            not pa.types.is_decimal128(target) or target.scale != conv.ps[1]:
        return None
    silver = pc.cast(text, target)  # NaN, infinities fail: the converter raises its error
    return decimal_array_to_bytes(silver), silver


_FAST: dict[type, Fast] = {
    TimestampTzConverter: _timestamptz,
    TimestampConverter: _timestamp,
    DateConverter: _date,
    NumericConverter: _numeric,
}


def fast_convert(conv: ColumnConverter, text: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``(to_bronze(text), to_silver(text))`` of one column."""
    fast = _FAST.get(type(conv))
    if fast is not None and isinstance(text, pa.StringArray) and len(text) and \
            (conv.bronze_field.nullable or text.null_count == 0) and \
            text.null_count < len(text):
        try:
            out = fast(conv, text)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            out = None  # a value the canonical shape did not cover: the converter decides
        if out is not None and out[0].type == conv.bronze_field.type and \
                out[1].type == conv.silver_field.type:
            return out
    bronze = conv.to_bronze(text)
    return bronze, conv.from_bronze(bronze)
