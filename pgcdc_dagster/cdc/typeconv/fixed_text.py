"""Vectorised text rewriting on Arrow string buffers (numpy gathers, no per-value Python).

Used where PostgreSQL's text output has one canonical fixed shape: sessions pinned to
``TimeZone = UTC`` and ISO dates (``postgres/snapshot_read.SESSION_SETTINGS``, also set for
slot peeks) print every finite TIMESTAMPTZ of a 4-digit AD year as
``YYYY-MM-DD HH:MM:SS[.f]+00``; its Debezium ``ZonedTimestamp`` is the same text with ``T``
for the space, the fraction padded to the column's precision and ``Z`` for ``+00`` — a
fixed-width string built by one gather. Anything else returns None: the caller takes its
general (exact) path.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa


def string_parts(text: pa.StringArray
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


def fixed_strings(rows: npt.NDArray[np.uint8], valid: npt.NDArray[np.bool_] | None,
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


def zoned_utc_text(text: pa.StringArray, width: int | None) -> pa.StringArray | None:
    """``ZonedTimestamp`` strings of UTC TIMESTAMPTZ text, or None if a value is not canonical.

    PostgreSQL prints 1 to 6 fraction digits (trailing zeros dropped, none for a whole
    second); the result has exactly ``width`` of them (none when ``width`` is None). Ending
    in ``+00`` with a 4-digit year is the whole canonical test (BC years end in `` BC``,
    infinities are words). An array without any valid value is not handled here.
    """
    digits_max = width or 0
    starts, ends, data, valid = string_parts(text)
    if not len(starts):
        return None
    lengths = ends - starts
    if not bool(np.all((lengths >= 22) & (lengths <= (23 + digits_max if digits_max else 22)))):
        return None
    if not bool(np.all((data[ends - 3] == _PLUS) & (data[ends - 2] == _ZERO)
                       & (data[ends - 1] == _ZERO) & (data[starts + 4] == _DASH)
                       & (data[starts + 7] == _DASH) & (data[starts + 10] == _SPACE)
                       & (data[starts + 13] == _COLON) & (data[starts + 16] == _COLON)
                       & ((lengths == 22) | (data[starts + 19] == _DOT)))):
        return None
    size = 20 + (digits_max + 1 if digits_max else 0)
    rows = np.empty((len(starts), size), dtype=np.uint8)
    rows[:, :19] = data[starts[:, None] + np.arange(19)]
    rows[:, 10] = ord("T")
    if digits_max:
        rows[:, 19] = _DOT
        digits = np.arange(digits_max)
        at = np.minimum(starts[:, None] + 20 + digits, len(data) - 1)
        rows[:, 20:20 + digits_max] = np.where(digits < (lengths - 23)[:, None], data[at],
                                               _ZERO)
    rows[:, size - 1] = ord("Z")
    return fixed_strings(rows, valid, len(text))
