"""Incremental parser of PostgreSQL's ``COPY ... (FORMAT binary)`` stream.

Format (PostgreSQL docs, COPY, "Binary Format"): an 11-byte signature
``PGCOPY\\n\\377\\r\\n\\0``, Int32 flags (bit 16: OIDs included, not supported here), Int32
header-extension length and that many bytes; then per tuple an Int16 field count followed,
per field, by an Int32 length (-1 for NULL) and the value bytes; finally the trailer, an
Int16 of -1. All integers are big-endian.

:class:`CopyBinaryParser` accepts chunks of any size (psycopg2's ``copy_expert`` calls
``file.write(chunk)`` once per CopyData message) and returns the complete tuples seen so far.
It keeps at most one incomplete tuple buffered and never re-scans bytes it has already
found insufficient, so feeding a large tuple in small pieces stays linear.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from pgcdc_dagster.exceptions import DecodeError

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_HEADER = struct.Struct(">11sii")  # signature, flags, header extension length
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_FLAG_OIDS = 1 << 16
TRAILER = b"\xff\xff"
"""The stream's end: a field count of -1."""


def header_length(data: bytes, label: str) -> int:
    """Bytes of the stream header at the start of ``data`` (which holds all of it): the
    signature, the flags and the header extension.

    Raises:
        DecodeError: no binary signature, the OIDs flag, or a header cut short.
    """
    if len(data) < _HEADER.size or not data.startswith(SIGNATURE):
        raise DecodeError(f"{label}: the COPY stream does not start with the binary signature")
    _sig, flags, extension = _HEADER.unpack_from(data)
    if flags & _FLAG_OIDS:
        raise DecodeError(f"{label}: binary COPY with OIDs is not supported")
    if not 0 <= extension <= len(data) - _HEADER.size:
        raise DecodeError(f"{label}: header extension length {extension} past the data")
    return int(_HEADER.size + extension)

Field = bytes | None
CopyTuple = tuple[Field, ...]


class CopyBinaryParser:
    """Feed COPY BINARY bytes in arbitrary chunks; get back complete tuples."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._need = 0
        self._header_done = False
        self._finished = False
        self.offset = 0
        """Stream offset of the first byte not yet consumed (for error messages)."""
        self.tuples = 0
        """Number of tuples returned so far."""

    @property
    def finished(self) -> bool:
        """The -1 trailer has been read."""
        return self._finished

    @property
    def at_boundary(self) -> bool:
        """The header is read and no partial tuple is buffered: the next byte starts a tuple."""
        return self._header_done and not self._pending and not self._finished

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[CopyTuple]:
        """Consume one chunk and return the tuples it completed, in order.

        Raises:
            DecodeError: bad signature, OIDs flag, a negative field count other than the
                trailer, a length below -1, or bytes after the trailer.
        """
        if self._finished:
            if len(chunk):
                raise DecodeError(
                    f"COPY binary: {len(chunk)} bytes after the trailer at stream offset "
                    f"{self.offset}")
            return []
        if self._pending:
            self._pending += chunk
            if len(self._pending) < self._need:
                return []
            data = bytes(self._pending)
            self._pending = bytearray()
        else:
            data = bytes(chunk)
        rows: list[CopyTuple] = []
        pos = 0 if self._header_done else self._read_header(data)
        if pos < 0:
            self._stash(data, 0, -pos)
            return rows
        size = len(data)
        i16, i32 = _I16.unpack_from, _I32.unpack_from
        while pos < size:
            if pos + 2 > size:
                self._stash(data, pos, 2)
                return rows
            nfields = i16(data, pos)[0]
            if nfields < 0:
                self._trailer(nfields, data, pos)
                return rows
            p = pos + 2
            fields: list[Field] = []
            for _ in range(nfields):
                if p + 4 > size:
                    break
                length = i32(data, p)[0]
                p += 4
                if length == -1:
                    fields.append(None)
                    continue
                if length < 0:
                    raise DecodeError(
                        f"COPY binary: field length {length} at stream offset "
                        f"{self.offset + p - 4 - pos}")
                if p + length > size:
                    p += length
                    break
                fields.append(data[p:p + length])
                p += length
            if len(fields) < nfields:
                self._stash(data, pos, p - pos + (4 if p <= size else 0))
                return rows
            rows.append(tuple(fields))
            self.tuples += 1
            self.offset += p - pos
            pos = p
        return rows

    def _read_header(self, data: bytes) -> int:
        """Parse the header; return the offset after it, or -(bytes needed) if incomplete."""
        if len(data) < _HEADER.size:
            return -_HEADER.size
        signature, flags, ext = _HEADER.unpack_from(data, 0)
        if signature != SIGNATURE:
            raise DecodeError(f"COPY binary: bad signature {signature!r} at stream offset 0")
        if flags & _FLAG_OIDS:
            raise DecodeError("COPY binary: OIDs flag set in the header (stream offset 11)")
        if ext < 0:
            raise DecodeError(f"COPY binary: header extension length {ext} at stream offset 15")
        end: int = _HEADER.size + ext
        if len(data) < end:
            return -end
        self._header_done = True
        self.offset = end
        return end

    def _trailer(self, nfields: int, data: bytes, pos: int) -> None:
        if nfields != -1:
            raise DecodeError(
                f"COPY binary: field count {nfields} at stream offset {self.offset}")
        self._finished = True
        self.offset += 2
        if pos + 2 != len(data):
            raise DecodeError(
                f"COPY binary: {len(data) - pos - 2} bytes after the trailer at stream "
                f"offset {self.offset}")

    def _stash(self, data: bytes, pos: int, need: int) -> None:
        """Keep the incomplete tail; do not parse again before ``need`` bytes are buffered."""
        self._pending = bytearray(data[pos:])
        self._need = max(need, len(self._pending) + 1)

    def close(self) -> None:
        """Check the stream ended cleanly.

        Raises:
            DecodeError: the trailer is missing or a partial tuple is left over.
        """
        if not self._finished:
            state = f"{len(self._pending)} bytes of a partial tuple" if self._pending else (
                "no trailer")
            raise DecodeError(f"COPY binary: stream ended early ({state}) at stream offset "
                              f"{self.offset}")


class CopyBinarySink:
    """A file-like ``write`` target for ``copy_expert`` that hands each tuple to a callback."""

    def __init__(self, on_tuple: Callable[[CopyTuple], None]) -> None:
        self.parser = CopyBinaryParser()
        self._on_tuple = on_tuple
        self.bytes = 0

    def write(self, chunk: bytes | bytearray | memoryview) -> int:
        """Parse ``chunk`` and call the callback for every completed tuple."""
        self.bytes += len(chunk)
        for row in self.parser.feed(chunk):
            self._on_tuple(row)
        return len(chunk)


_SLOT_ROW = struct.Struct(">hiqiIi")  # 3 fields; 8, lsn; 4, xid; data length
_SLOT_FRAME = _SLOT_ROW.size


class SlotRowSink:
    """A ``copy_expert`` target for ``COPY (SELECT lsn, xid, data FROM
    pg_logical_slot_peek_binary_changes(...)) TO STDOUT (FORMAT binary)``: calls
    ``on_row(lsn, data)`` for every slot row.

    psycopg2 writes one CopyData message, normally one whole row, at a time: such a chunk
    is read with one ``struct`` unpack of its framing; anything else (the header, the
    trailer, a row split across writes) goes through :class:`CopyBinaryParser`.
    """

    def __init__(self, on_row: Callable[[int, bytes], None]) -> None:
        self.parser = CopyBinaryParser()
        self.rows = 0
        """Slot rows handed to ``on_row`` so far."""
        self._on_row = on_row
        self._ready = False

    def write(self, chunk: bytes) -> int:
        """Hand over the rows ``chunk`` completes.

        Raises:
            DecodeError: malformed COPY data, or a row that is not (lsn, xid, data).
        """
        size = len(chunk)
        if self._ready and size > _SLOT_FRAME:
            nfields, len_lsn, lsn, len_xid, _, len_data = _SLOT_ROW.unpack_from(chunk)
            if nfields == 3 and len_lsn == 8 and len_xid == 4 and len_data + _SLOT_FRAME == size:
                self.rows += 1
                self._on_row(lsn, chunk[_SLOT_FRAME:])
                return size
        for row in self.parser.feed(chunk):
            if len(row) != 3 or row[0] is None or len(row[0]) != 8 or row[2] is None:
                raise DecodeError(f"slot COPY row has an unexpected shape: {row!r:.200}")
            self.rows += 1
            self._on_row(int.from_bytes(row[0], "big"), row[2])
        self._ready = self.parser.at_boundary
        return size

    def close(self) -> None:
        """Check that the stream ended cleanly (see :meth:`CopyBinaryParser.close`)."""
        self.parser.close()


def parse_copy_binary(data: bytes) -> list[CopyTuple]:
    """Parse a complete COPY BINARY stream held in memory.

    Raises:
        DecodeError: malformed or incomplete stream.
    """
    parser = CopyBinaryParser()
    rows = parser.feed(data)
    parser.close()
    return rows
