"""Rows out of a raw ``COPY ... TO STDOUT (FORMAT binary)`` protocol stream, a buffer at a time.

The snapshot reader receives the COPY's protocol messages straight from the socket into
large buffers (:mod:`pgcdc_dagster.postgres.copy_socket`), so no Python runs per row; this
module finds the rows in those buffers. PostgreSQL sends each row as one ``CopyData``
message (``'d'``, an Int32 length that counts itself, then the tuple: an Int16 field count
and the fields). The message boundaries form a chain (each message's end is the next one's
start), so finding them is a sequential walk in principle; here it is vectorised:

1. every ``'d'`` byte followed by a plausible length and the expected field count is a
   candidate message start (a value's bytes can look like one: a false candidate);
2. each candidate's end is computed from its length; a run of candidates where every end is
   the next candidate's start is a run of real rows once its first member is a real
   boundary (the chain cannot enter a false candidate from a real boundary, since real
   boundaries only lead to real boundaries);
3. where the chain breaks (a false candidate in between, or any other message: the stream
   header, the trailer, CopyDone, CommandComplete, ReadyForQuery, notices, an error), one
   message is read the plain way and the run resumes at the next real boundary.

When the compiled loops are available (:mod:`pgcdc_dagster.native`), steps 1 and 2 are one
call that walks the chain message by message instead (same rows, same hand-over to step 3).

Every message is checked (lengths, field counts, the binary signature, the message types a
COPY OUT may carry); a malformed stream raises :class:`~pgcdc_dagster.exceptions.DecodeError`.
An ``ErrorResponse`` is kept (:attr:`CopyOutFramer.error`) until ``ReadyForQuery`` ends the
stream. The fields of the rows are walked by :func:`pgcdc_dagster.cdc.copy_columns.split_fields`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pgcdc_dagster.cdc.copy_columns import numbers_at
from pgcdc_dagster.cdc.pgcopy import TRAILER, header_length
from pgcdc_dagster.exceptions import DecodeError
from pgcdc_dagster.native import copyscan

Ints = npt.NDArray[np.int64]
Bytes = npt.NDArray[np.uint8]

_D = ord("d")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
READY_FOR_QUERY = b"Z\x00\x00\x00\x05"
"""A ``ReadyForQuery`` message up to its status byte: the last message of the reply."""
_IGNORED = frozenset(b"NSA")
"""Notices, parameter changes and notifications may arrive at any time; they carry no rows."""
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class ServerError:
    """An ``ErrorResponse``: its SQLSTATE and message (severity first, as libpq prints)."""

    sqlstate: str
    message: str


def _heads(data: Bytes, starts: Ints) -> tuple[Ints, Ints]:
    """Length and field count of the messages at ``starts`` (8 bytes readable at each)."""
    # one 8-byte gather per start (a window view indexed by rows copies byte by byte)
    head: npt.NDArray[np.uint64] = numbers_at(data, ">u8")[starts].astype(np.uint64)
    length = ((head >> np.uint64(24)) & np.uint64(0xFFFFFFFF)).astype(np.int64)
    count = ((head >> np.uint64(8)) & np.uint64(0xFFFF)).astype(np.int64)
    return length, count


@dataclass
class CopyOutFramer:
    """Finds the rows of one COPY OUT reply (binary format), buffer after buffer.

    Call :meth:`frame` on each buffer (the bytes not consumed last time first); it returns
    where every complete row lies and how far the complete messages reach. :attr:`done`
    turns true at ``ReadyForQuery``; :attr:`error` holds the server's error, if any.
    """

    label: str = "COPY"
    ncols: int | None = None
    """Field count of every row (from ``CopyOutResponse``)."""
    done: bool = False
    error: ServerError | None = None
    _header: bool = False
    _trailer: bool = False
    _copying: bool = False
    _starts: list[Ints] = field(default_factory=list)
    _ends: list[Ints] = field(default_factory=list)

    def frame(self, data: Bytes, pos: int, end: int) -> tuple[Ints, Ints, int]:
        """Rows in the complete messages of ``data[pos:end]``.

        Returns each row's start and end offsets in ``data`` (the tuple, without its message
        header) and the offset after the last complete message (where the next buffer must
        resume). Messages after ``ReadyForQuery`` are left alone.
        """
        self._starts, self._ends = [], []
        runs: tuple[Ints, Ints, Ints] | None = None
        native = copyscan.library()
        while pos < end and not self.done:
            if self._header and not self._trailer and data[pos] == _D:
                if native is not None and self.ncols is not None \
                        and 0 <= self.ncols <= copyscan.MAX_COLUMNS:
                    moved = self._native_run(native, data, pos, end, self.ncols)
                else:
                    if runs is None:
                        runs = self._candidates(data, pos, end)
                    moved = self._run(runs, pos, end)
                if moved > pos:
                    pos = moved
                    continue
            moved = self._message(data, pos, end)
            if moved == pos:
                break  # an incomplete message: the next buffer completes it
            pos = moved
        starts = np.concatenate(self._starts) if self._starts else _EMPTY
        ends = np.concatenate(self._ends) if self._ends else _EMPTY
        return starts, ends, pos

    @property
    def complete(self) -> bool:
        """The binary trailer was received (every row is in)."""
        return self._trailer

    # -- the vectorised path ----------------------------------------------------------------

    def _candidates(self, data: Bytes, pos: int, end: int) -> tuple[Ints, Ints, Ints]:
        """Candidate row messages in ``data[pos:end]``: starts, ends, and the indices where
        the chain of candidates breaks."""
        starts = np.flatnonzero(data[pos:max(end - 6, pos)] == _D)
        starts += pos
        length, count = _heads(data, starts)
        ok = (count == self.ncols) & (length >= 6) & (length < 1 << 31)
        starts = starts[ok]
        ends = starts + 1 + length[ok]
        breaks = np.flatnonzero(ends[:-1] != starts[1:]).astype(np.int64)
        return starts, ends, np.append(breaks, len(starts) - 1)

    def _run(self, runs: tuple[Ints, Ints, Ints], pos: int, end: int) -> int:
        """Take the run of linked row messages that starts at ``pos`` (a real boundary)."""
        starts, ends, breaks = runs
        k = int(np.searchsorted(starts, pos))
        if k >= len(starts) or starts[k] != pos:
            return pos
        last = int(breaks[np.searchsorted(breaks, k)])
        complete = int(np.searchsorted(ends[k:last + 1], end, side="right"))
        if complete == 0:
            return pos
        self._starts.append(starts[k:k + complete] + 5)
        self._ends.append(ends[k:k + complete])
        return int(ends[k + complete - 1])

    def _native_run(self, native: copyscan.CopyScan, data: Bytes, pos: int, end: int,
                    ncols: int) -> int:
        """The same run, walked message by message in compiled code."""
        starts, ends, moved = native.frame_rows(data, pos, end, ncols)
        if len(starts):
            self._starts.append(starts)
            self._ends.append(ends)
        return moved

    # -- one message the plain way ------------------------------------------------------------

    def _message(self, data: Bytes, pos: int, end: int) -> int:
        if end - pos < 5:
            return pos
        kind = int(data[pos])
        length = int(_INT32.unpack(data[pos + 1:pos + 5].tobytes())[0])
        if length < 4:
            raise DecodeError(f"{self.label}: protocol message {chr(kind)!r} with length "
                              f"{length} at byte {pos}")
        stop = pos + 1 + length
        if stop > end:
            return pos
        body = data[pos + 5:stop]
        if kind == ord("H"):
            self._copy_out(body.tobytes())
        elif kind == _D:
            self._data(body, pos + 5, stop)
        elif kind == ord("E"):
            self.error = _error(body.tobytes())
        elif kind == ord("Z"):
            self.done = True
        elif kind in (ord("c"), ord("C")) or kind in _IGNORED:
            pass
        else:
            raise DecodeError(f"{self.label}: unexpected protocol message {chr(kind)!r} in "
                              f"the COPY reply (byte {pos})")
        return stop

    def _copy_out(self, body: bytes) -> None:
        if len(body) < 3 or body[0] != 1:
            raise DecodeError(f"{self.label}: the COPY reply is not in binary format")
        (self.ncols,) = struct.unpack_from(">h", body, 1)
        self._copying = True

    def _data(self, body: Bytes, start: int, stop: int) -> None:
        if not self._copying:
            raise DecodeError(f"{self.label}: CopyData before CopyOutResponse")
        if not self._header:
            skip = header_length(body.tobytes(), self.label)
            self._header = True
            start += skip
            body = body[skip:]
            if not len(body):
                return
        if self._trailer:
            raise DecodeError(f"{self.label}: data after the binary COPY trailer")
        if body.tobytes() == TRAILER:
            self._trailer = True
            return
        count = _INT16.unpack(body[:2].tobytes())[0] if len(body) >= 2 else -2
        if count != self.ncols:
            raise DecodeError(f"{self.label}: a row with {count} fields, expected "
                              f"{self.ncols} (byte {start})")
        self._starts.append(np.array([start], dtype=np.int64))
        self._ends.append(np.array([stop], dtype=np.int64))


def _error(body: bytes) -> ServerError:
    """The fields of an ``ErrorResponse`` (each a type byte and a NUL-terminated string)."""
    fields: dict[str, str] = {}
    for part in body.split(b"\x00"):
        if part:
            fields[chr(part[0])] = part[1:].decode("utf-8", "replace")
    severity = fields.get("S", "ERROR")
    message = f"{severity}:  {fields.get('M', 'unknown error')}"
    if "D" in fields:
        message += f"\nDETAIL:  {fields['D']}"
    if "H" in fields:
        message += f"\nHINT:  {fields['H']}"
    return ServerError(fields.get("C", "XX000"), message)
