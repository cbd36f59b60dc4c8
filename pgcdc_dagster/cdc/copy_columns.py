"""Column-wise decoding of ``COPY ... TO STDOUT (FORMAT binary)`` rows with numpy.

The rows of a batch lie in one buffer (:class:`RowSpans`: the receive buffer of the socket
reader, whose framing gives every row's start and end, or rows from psycopg2 joined
together). :func:`split_fields` walks the fields of all rows at once, one column at a time
(a row is an Int16 field count, then per field an Int32 length, -1 for NULL, and the value
bytes; big-endian): for every column it returns where each row's value starts and how long
it is. Values are then taken out as fixed-width numbers (:func:`fixed_values`) or as
strings that reference the buffer (:func:`string_values`, an Arrow ``string_view`` cast to
``string``). No Python runs per row; the format is checked (field counts, lengths, every
row consumed exactly; the walk runs in compiled code when :mod:`pgcdc_dagster.native` is
available) and a bad buffer raises :class:`~pgcdc_dagster.exceptions.DecodeError`
naming the row and column.

The stream header and trailer are the reader's business
(:mod:`pgcdc_dagster.cdc.copy_frames` and :mod:`pgcdc_dagster.postgres.binary_read`
strip them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pgcdc_dagster.exceptions import DecodeError
from pgcdc_dagster.native import copyscan

Ints = npt.NDArray[np.int64]


_PAD = bytes(16)
"""Zero bytes after the rows, so that fixed-width windows never run past the buffer."""


@dataclass(frozen=True)
class RowSpans:
    """Binary COPY tuples in one buffer: row ``i`` is ``data[start[i]:end[i]]``.

    At least ``len(_PAD)`` bytes of ``data`` follow the last row (any bytes: fixed-width
    windows read there and discard what they read).
    """

    data: bytes | bytearray | npt.NDArray[np.uint8]
    start: Ints
    end: Ints

    def __len__(self) -> int:
        return len(self.start)

    def rows(self) -> list[bytes]:
        """Each row's bytes (for tests and error reports; the decoder never needs them)."""
        data = self.data
        view = data.data if isinstance(data, np.ndarray) else memoryview(data)
        return [bytes(view[s:e]) for s, e in zip(self.start.tolist(), self.end.tolist(),
                                                   strict=True)]


def join_rows(rows: Sequence[bytes]) -> RowSpans:
    """Rows received one by one (psycopg2's ``copy_expert``) as one buffer."""
    row_len = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    end = np.cumsum(row_len)
    return RowSpans(b"".join([*rows, _PAD]), end - row_len, end)


@dataclass(frozen=True)
class BinaryRows:
    """A batch of binary COPY rows, split into fields."""

    data: npt.NDArray[np.uint8]
    """The buffer that holds the rows."""
    buffer: pa.Buffer
    """The same bytes as an Arrow buffer (string values reference it)."""
    starts: tuple[Ints, ...]
    """Per column: offset of each row's value in ``data``."""
    lengths: tuple[npt.NDArray[np.int32], ...]
    """Per column: each row's value length, -1 for NULL."""

    @property
    def num_rows(self) -> int:
        return len(self.starts[0]) if self.starts else 0


def numbers_at(data: npt.NDArray[np.uint8], dtype: str) -> npt.NDArray[np.generic]:
    """A view of ``data`` where element ``i`` is the ``dtype`` number at byte ``i``
    (overlapping elements, one byte apart): indexing it with byte positions gathers numbers
    at any offset, in one pass (much cheaper than slicing windows)."""
    width = np.dtype(dtype).itemsize
    return np.ndarray(shape=(max(len(data) - width + 1, 0),), dtype=dtype, buffer=data,
                      strides=(1,))


def split_fields(rows: Sequence[bytes] | RowSpans, ncols: int, *,
                 label: str = "COPY") -> BinaryRows:
    """Walk every field of ``rows`` (one complete tuple each).

    A quick walk checks only what it must to stay inside the buffer; when anything is
    wrong a careful walk finds the first bad row and column to name them.

    Raises:
        DecodeError: a row with another field count than ``ncols``, a length below -1, or
            a row whose fields do not end exactly at its end.
    """
    spans = rows if isinstance(rows, RowSpans) else join_rows(rows)
    data = np.frombuffer(spans.data, dtype=np.uint8)
    if len(spans) and int(spans.end[-1]) + len(_PAD) > len(data):
        raise DecodeError(f"{label}: the rows' buffer has no room after the last row")
    native = copyscan.library() if 0 <= ncols <= copyscan.MAX_COLUMNS else None
    if native is not None:
        walked = _native_walk(native, data, spans, ncols)
    else:
        walked = _quick_walk(data, spans, ncols)
    if walked is None:
        _careful_walk(data, spans, ncols, label)
        raise DecodeError(f"{label}: malformed rows")  # the careful walk names the fault
    starts, lengths = walked
    return BinaryRows(data, pa.py_buffer(spans.data), starts, lengths)


def _native_walk(native: copyscan.CopyScan, data: npt.NDArray[np.uint8], spans: RowSpans,
                 ncols: int
                 ) -> tuple[tuple[Ints, ...], tuple[npt.NDArray[np.int32], ...]] | None:
    """The quick walk in compiled code (same results, same faults)."""
    walked = native.walk_fields(data, spans.start, spans.end, ncols)
    if walked is None:
        return None
    starts, lengths = walked
    return tuple(starts), tuple(lengths)


def _quick_walk(data: npt.NDArray[np.uint8], spans: RowSpans, ncols: int
                ) -> tuple[tuple[Ints, ...], tuple[npt.NDArray[np.int32], ...]] | None:
    """Every column's value starts and lengths, or None when a row is malformed."""
    n = len(spans)
    if not n:
        empty = np.zeros(0, dtype=np.int64)
        return (empty,) * ncols, (np.zeros(0, dtype=np.int32),) * ncols
    if int((spans.end - spans.start).min()) < 2:
        return None
    if not bool((numbers_at(data, ">i2")[spans.start] == ncols).all()):
        return None
    int32 = numbers_at(data, ">i4")
    pos = spans.start + 2
    starts: list[Ints] = []
    lengths: list[npt.NDArray[np.int32]] = []
    for _col in range(ncols):
        try:
            length = int32[pos].astype(np.int32)
        except IndexError:  # a length field past the buffer (the gather checks bounds)
            return None
        if int(length.min()) < -1:
            return None
        pos = pos + 4
        starts.append(pos)
        lengths.append(length)
        pos = pos + np.maximum(length, 0)
    if not np.array_equal(pos, spans.end):
        return None
    return tuple(starts), tuple(lengths)


def _careful_walk(data: npt.NDArray[np.uint8], spans: RowSpans, ncols: int,
                  label: str) -> None:
    """Raise a DecodeError naming the first malformed row (and column)."""
    row_start, ends = spans.start, spans.end
    row_len = ends - row_start
    if int(row_len.min()) < 2:
        raise DecodeError(f"{label}: row {int(np.argmin(row_len))} is shorter than its field "
                          "count")
    counts = numbers_at(data, ">i2")[row_start]
    bad = np.flatnonzero(counts != ncols)
    if len(bad):
        raise DecodeError(f"{label}: row {int(bad[0])} has {int(counts[bad[0]])} fields, "
                          f"expected {ncols} (byte offset {int(row_start[bad[0]])})")
    int32 = numbers_at(data, ">i4")
    pos = row_start + 2
    for col in range(ncols):
        short = np.flatnonzero(pos + 4 > ends)
        if len(short):
            raise DecodeError(f"{label}: row {int(short[0])} ends inside the length of "
                              f"column {col} (byte offset {int(pos[short[0]])})")
        length = int32[pos].astype(np.int64)
        if int(length.min()) < -1:
            r = int(np.argmin(length))
            raise DecodeError(f"{label}: row {r} column {col} has length {int(length[r])} "
                              f"(byte offset {int(pos[r])})")
        pos = pos + 4 + np.maximum(length, 0)
    wrong = np.flatnonzero(pos != ends)
    if len(wrong):
        r = int(wrong[0])
        raise DecodeError(f"{label}: row {r}'s fields end at byte {int(pos[r])}, the row at "
                          f"{int(ends[r])}")


def nulls(rows: BinaryRows, col: int) -> npt.NDArray[np.bool_]:
    """True where the column is NULL."""
    return rows.lengths[col] < 0


def fixed_values(rows: BinaryRows, col: int, dtype: str) -> npt.NDArray[np.generic]:
    """The column's values as numbers of the big-endian ``dtype`` (e.g. ``'>i8'``), in
    native byte order; NULL rows hold 0.

    Raises:
        DecodeError: a non-NULL value of another width.
    """
    native = copyscan.library()
    if native is not None:
        done = native.fixed_values(rows.data, rows.starts[col], rows.lengths[col],
                                   np.dtype(dtype))
        if done is not None:
            return done
    width = np.dtype(dtype).itemsize
    length = rows.lengths[col]
    null = length < 0
    nulls = int(np.count_nonzero(null))
    if int(np.count_nonzero(length == width)) + nulls != len(length):
        wrong = np.flatnonzero(~null & (length != width))
        raise DecodeError(f"row {int(wrong[0])} column {col}: {int(length[wrong[0]])} bytes "
                          f"where {width} were expected (was the column's type changed while "
                          "the snapshot ran? run it again: it is planned with the new type)")
    start = np.where(null, 0, rows.starts[col]) if nulls else rows.starts[col]
    values = numbers_at(rows.data, dtype)[start].astype(np.dtype(dtype).newbyteorder("="))
    if nulls:
        values[null] = 0
    return values


def validity(null: npt.NDArray[np.bool_]) -> pa.Buffer | None:
    """An Arrow validity bitmap for the mask (None when nothing is NULL)."""
    if not null.any():
        return None
    return pa.array(~null, pa.bool_()).buffers()[1]


def _inline_masks() -> npt.NDArray[np.uint32]:
    """Row ``k`` (0..12): three words that keep the first ``k`` bytes of 12 read in memory
    order; row 13 keeps the first 4 (a long value's prefix)."""
    keep = np.zeros((14, 12), dtype=np.uint8)
    for k in range(13):
        keep[k, :k] = 0xFF
    keep[13, :4] = 0xFF
    return np.ascontiguousarray(keep).view("<u4")


_INLINE_MASKS = _inline_masks()


def string_values(rows: BinaryRows, col: int, skip: int = 0) -> pa.StringArray:
    """The column's values as strings (the bytes after the first ``skip`` of each value).

    Copied by the compiled loops when they are available; else built as an Arrow
    ``string_view`` over the batch buffer (values up to 12 bytes inline,
    longer ones by offset), then cast to ``string``: one copy of each value, no Python per
    value. The bytes are not checked as UTF-8 (the server sends valid client-encoding text).
    """
    n = rows.num_rows
    native = copyscan.library()
    built = None if native is None or len(rows.data) >= 2**31 else \
        native.strings(rows.data, rows.starts[col], rows.lengths[col], skip)
    if built is not None:
        null = rows.lengths[col] < 0
        offsets, values = built
        made = pa.Array.from_buffers(pa.string(), n, [validity(null), pa.py_buffer(offsets),
                                                      pa.py_buffer(values)],
                                     null_count=int(np.count_nonzero(null)))
        assert isinstance(made, pa.StringArray)
        return made
    length = rows.lengths[col].astype(np.int64)
    null = length < 0
    start = rows.starts[col] + skip
    length = np.where(null, 0, length - skip)
    if int(length.min(initial=0)) < 0:
        r = int(np.argmin(length))
        raise DecodeError(f"row {r} column {col}: value shorter than its {skip}-byte header")
    if len(rows.data) >= 2**31:
        raise DecodeError(f"column {col}: a batch of 2 GiB or more cannot be referenced")
    # A view: Int32 length, then up to 12 bytes inline (zero after the value); or the 4
    # prefix bytes, buffer 0, offset. The 12 bytes after each value's start are gathered
    # at once (one "V12" element per byte offset) and masked to the value's inline bytes;
    # a long value's last two words are then its buffer index (0) and offset.
    short = length <= 12
    at = np.where(null, 0, start)
    views = np.empty((n, 4), dtype="<u4")
    views[:, 0] = length
    inline = numbers_at(rows.data, "V12")[at].view("<u4").reshape(n, 3)
    inline &= _INLINE_MASKS[np.where(short, length, 13)]
    views[:, 1:] = inline
    if not bool(short.all()):
        views[:, 3] = np.where(short, views[:, 3], start)
    out = pa.Array.from_buffers(pa.string_view(), n,
                                [validity(null), pa.py_buffer(views), rows.buffer],
                                null_count=int(null.sum()))
    cast = out.cast(pa.string())
    assert isinstance(cast, pa.StringArray)
    return cast
