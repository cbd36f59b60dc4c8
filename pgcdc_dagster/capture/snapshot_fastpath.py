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
TIMESTAMPTZ, the costliest, works on the string buffers themselves (numpy, shared with the
stream: ``cdc.typeconv.fixed_text``): its bronze value is the text with ``T`` for the space,
the fraction padded to the column's precision and ``Z`` for ``+00``, built by one gather.
``tests/integration/test_snapshot_fastpath.py`` checks the two agree, value for value, on
real PostgreSQL output.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.cdc.typeconv.decimal_codec import decimal_array_to_bytes
from pgcdc_dagster.cdc.typeconv.fixed_text import zoned_utc_text
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


def _timestamptz(conv: ColumnConverter, text: pa.StringArray) -> tuple[pa.Array, pa.Array] | None:
    """ISO output in UTC (see :func:`~pgcdc_dagster.cdc.typeconv.fixed_text.zoned_utc_text`);
    silver is the bronze string cast to a timestamp."""
    assert isinstance(conv, TimestampTzConverter)
    bronze = zoned_utc_text(text, conv.width)
    if bronze is None:
        return None
    return bronze, pc.cast(bronze, pa.timestamp("us", tz="UTC"))


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
