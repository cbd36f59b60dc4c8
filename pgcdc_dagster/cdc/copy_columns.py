"""Column-wise decoding of ``COPY ... TO STDOUT (FORMAT binary)`` rows with numpy.

The rows of a batch lie in one buffer (:class:`RowSpans`: the receive buffer of the socket
reader, whose framing gives every row's start and end, or rows from psycopg2 joined
together). :func:`split_fields` walks the fields of all rows at once, one column at a time
(a row is an Int16 field count, then per field an Int32 length, -1 for NULL, and the value
bytes; big-endian): for every column it returns where each row's value starts and how long
it is. Values are then taken out as fixed-width numbers (:func:`fixed_values`) or as
strings that reference the buffer (:func:`string_values`, an Arrow ``string_view`` cast to
``string``). No Python runs per row; the format is checked (field counts, lengths, every
row consumed exactly) and a bad buffer raises :class:`~pgcdc_dagster.exceptions.DecodeError`
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

Ints = npt.NDArray[np.int64]


_PAD = bytes(16)
"""Zero bytes after the rows, so that fixed-width windows never run past the buffer."""


@dataclass(frozen=True)
class RowSpans:
    """Binary COPY tuples in one buffer: row ``i`` is ``data[start[i]:end[i]]``.

    At least ``len(_PAD)`` bytes of ``data`` follow the last row (any bytes: fixed-width
    windows read there and discard what they read).
    """

    data: bytes | bytearray
    start: Ints
    end: Ints

    def __len__(self) -> int:
        return len(self.start)

    def rows(self) -> list[bytes]:
        """Each row's bytes (for tests and error reports; the decoder never needs them)."""
        view = memoryview(self.data)
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


def _windows(data: npt.NDArray[np.uint8], width: int) -> npt.NDArray[np.uint8]:
    """Every ``width``-byte window of ``data`` (a view: row ``i`` starts at byte ``i``)."""
    return np.lib.stride_tricks.sliding_window_view(data, width)


def _int32_at(data: npt.NDArray[np.uint8], pos: Ints) -> npt.NDArray[np.int32]:
    """Big-endian Int32 at each position."""
    out: npt.NDArray[np.int32] = _windows(data, 4)[pos].view(">i4").ravel().astype(np.int32)
    return out


def split_fields(rows: Sequence[bytes] | RowSpans, ncols: int, *,
                 label: str = "COPY") -> BinaryRows:
    """Walk every field of ``rows`` (one complete tuple each).

    Raises:
        DecodeError: a row with another field count than ``ncols``, a length below -1, or
            a row whose fields do not end exactly at its end.
    """
    spans = rows if isinstance(rows, RowSpans) else join_rows(rows)
    n = len(spans)
    data = np.frombuffer(spans.data, dtype=np.uint8)
    row_start, ends = spans.start, spans.end
    row_len = ends - row_start
    if n and int(ends[-1]) + len(_PAD) > len(data):
        raise DecodeError(f"{label}: the rows' buffer has no room after the last row")
    if n and int(row_len.min()) < 2:
        raise DecodeError(f"{label}: row {int(np.argmin(row_len))} is shorter than its field "
                          "count")
    counts = (data[row_start].astype(np.int64) << 8) | data[row_start + 1] if n else row_start
    bad = np.flatnonzero(counts != ncols)
    if len(bad):
        raise DecodeError(f"{label}: row {int(bad[0])} has {int(counts[bad[0]])} fields, "
                          f"expected {ncols} (byte offset {int(row_start[bad[0]])})")
    pos = row_start + 2
    starts: list[Ints] = []
    lengths: list[npt.NDArray[np.int32]] = []
    for col in range(ncols):
        short = np.flatnonzero(pos + 4 > ends)
        if len(short):
            raise DecodeError(f"{label}: row {int(short[0])} ends inside the length of "
                              f"column {col} (byte offset {int(pos[short[0]])})")
        length = _int32_at(data, pos)
        if n and int(length.min()) < -1:
            r = int(np.argmin(length))
            raise DecodeError(f"{label}: row {r} column {col} has length {int(length[r])} "
                              f"(byte offset {int(pos[r])})")
        start = pos + 4
        starts.append(start)
        lengths.append(length)
        pos = start + np.maximum(length, 0)
    wrong = np.flatnonzero(pos != ends)
    if len(wrong):
        r = int(wrong[0])
        raise DecodeError(f"{label}: row {r}'s fields end at byte {int(pos[r])}, the row at "
                          f"{int(ends[r])}")
    return BinaryRows(data, pa.py_buffer(spans.data), tuple(starts), tuple(lengths))


def nulls(rows: BinaryRows, col: int) -> npt.NDArray[np.bool_]:
    """True where the column is NULL."""
    return rows.lengths[col] < 0


def fixed_values(rows: BinaryRows, col: int, dtype: str) -> npt.NDArray[np.generic]:
    """The column's values as numbers of the big-endian ``dtype`` (e.g. ``'>i8'``), in
    native byte order; NULL rows hold 0.

    Raises:
        DecodeError: a non-NULL value of another width.
    """
    width = np.dtype(dtype).itemsize
    length = rows.lengths[col]
    null = length < 0
    wrong = np.flatnonzero(~null & (length != width))
    if len(wrong):
        raise DecodeError(f"row {int(wrong[0])} column {col}: {int(length[wrong[0]])} bytes "
                          f"where {width} were expected (was the column's type changed while "
                          "the snapshot ran? run it again: it is planned with the new type)")
    start = np.where(null, 0, rows.starts[col])
    raw = _windows(rows.data, width)[start]
    values = raw.view(dtype).ravel().astype(np.dtype(dtype).newbyteorder("="))
    if null.any():
        values[null] = 0
    return values


def fixed_window(rows: BinaryRows, start: Ints, width: int) -> npt.NDArray[np.uint8]:
    """``width`` bytes at each position (rows of a 2-D array; positions from the batch)."""
    return _windows(rows.data, width)[start]


def validity(null: npt.NDArray[np.bool_]) -> pa.Buffer | None:
    """An Arrow validity bitmap for the mask (None when nothing is NULL)."""
    if not null.any():
        return None
    return pa.array(~null, pa.bool_()).buffers()[1]


def string_values(rows: BinaryRows, col: int, skip: int = 0) -> pa.StringArray:
    """The column's values as strings (the bytes after the first ``skip`` of each value).

    Built as an Arrow ``string_view`` over the batch buffer (values up to 12 bytes inline,
    longer ones by offset), then cast to ``string``: one copy of each value, no Python per
    value. The bytes are not checked as UTF-8 (the server sends valid client-encoding text).
    """
    n = rows.num_rows
    length = rows.lengths[col].astype(np.int64)
    null = length < 0
    start = rows.starts[col] + skip
    length = np.where(null, 0, length - skip)
    if int(length.min(initial=0)) < 0:
        r = int(np.argmin(length))
        raise DecodeError(f"row {r} column {col}: value shorter than its {skip}-byte header")
    if len(rows.data) >= 2**31:
        raise DecodeError(f"column {col}: a batch of 2 GiB or more cannot be referenced")
    # A view: Int32 length, then up to 12 bytes inline; or 4 prefix bytes, buffer 0, offset.
    short = length <= 12
    inline = _windows(rows.data, 12)[np.where(null, 0, start)]
    keep = np.arange(12) < np.where(short, length, 4)[:, None]
    views = np.empty((n, 16), dtype=np.uint8)
    views[:, 4:16] = inline * keep
    words = views.view("<i4")
    words[:, 0] = length
    words[:, 3] = np.where(short, words[:, 3], start)
    out = pa.Array.from_buffers(pa.string_view(), n,
                                [validity(null), pa.py_buffer(views), rows.buffer],
                                null_count=int(null.sum()))
    cast = out.cast(pa.string())
    assert isinstance(cast, pa.StringArray)
    return cast
