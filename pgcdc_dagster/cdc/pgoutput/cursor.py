"""A bounds-checked reader over one pgoutput message, used by the message decoder."""

from __future__ import annotations

import struct

from pgcdc_dagster.cdc.pgoutput.messages import MessageType, TupleData
from pgcdc_dagster.cdc.pgoutput.tuples import WireError, read_tuple_kinds
from pgcdc_dagster.exceptions import DecodeError

_XID = struct.Struct(">I")


class Cursor:
    """Bounds-checked reader over one message ``buf[pos:end]``; errors name the message
    type and the offset relative to the message start."""

    __slots__ = ("buf", "end", "mtype", "pos", "start")

    def __init__(self, buf: bytes, pos: int, end: int, mtype: MessageType) -> None:
        self.buf = buf
        self.start = pos
        self.pos = pos + 1
        self.end = end
        self.mtype = mtype

    def error(self, what: str, at: int | None = None) -> DecodeError:
        offset = (self.pos if at is None else at) - self.start
        return DecodeError(
            f"pgoutput {self.mtype.name} message ('{self.mtype.char}'): {what} "
            f"at byte offset {offset} (message length {self.end - self.start})")

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        if self.pos + fmt.size > self.end:
            raise self.error(f"truncated: needs {fmt.size} more bytes")
        values: tuple[int, ...] = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return values

    def string(self) -> str:
        nul = self.buf.find(b"\0", self.pos, self.end)
        if nul < 0:
            raise self.error("truncated: unterminated string")
        try:
            text = self.buf[self.pos:nul].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(f"string is not UTF-8 ({exc.reason})") from None
        self.pos = nul + 1
        return text

    def take(self, length: int) -> bytes:
        if self.pos + length > self.end:
            raise self.error(f"truncated: needs {length} more bytes")
        data = self.buf[self.pos:self.pos + length]
        self.pos += length
        return data

    def byte(self) -> int:
        if self.pos >= self.end:
            raise self.error("truncated: needs 1 more byte")
        self.pos += 1
        return self.buf[self.pos - 1]

    def tuple_data(self) -> TupleData:
        try:
            kinds, values, self.pos = read_tuple_kinds(self.buf, self.pos, self.end)
        except WireError as exc:
            raise self.error(exc.what, exc.offset) from None
        return TupleData(kinds, values)

    def stream_xid(self, in_stream: bool) -> int | None:
        return self.unpack(_XID)[0] if in_stream else None

    def finish(self) -> None:
        if self.pos != self.end:
            raise self.error(f"{self.end - self.pos} unexpected trailing bytes")
