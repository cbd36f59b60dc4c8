"""Error helpers of the assembler: every DecodeError names the message type, the byte
offset inside the message and the slot LSN of the row."""

from __future__ import annotations

from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.pgoutput import messages as m
from pgcdc_dagster.cdc.pgoutput.decoder import decode
from pgcdc_dagster.cdc.pgoutput.messages import MessageType
from pgcdc_dagster.exceptions import DecodeError


def message_error(code: int, what: str, offset: int, lsn: int) -> DecodeError:
    """A DecodeError for message type ``code`` (-1: empty message) at the slot row ``lsn``."""
    try:
        kind = MessageType(code)
        name = f"{kind.name} message ('{kind.char}')"
    except ValueError:
        name = f"message of unknown type {code:#04x}" if code >= 0 else "empty message"
    return DecodeError(f"pgoutput {name} at LSN {Lsn(lsn)}: {what} at byte offset {offset}")


def decode_at(buf: bytes, in_stream: bool, pos: int, end: int, lsn: int) -> m.PgOutputMessage:
    """:func:`~pgcdc_dagster.cdc.pgoutput.decoder.decode`, naming the slot LSN on error.

    Raises:
        DecodeError: see ``decode``.
    """
    try:
        return decode(buf, in_stream=in_stream, pos=pos, end=end)
    except DecodeError as exc:
        raise DecodeError(f"{exc} (slot row at LSN {Lsn(lsn)})") from None


def code_of(msg: m.PgOutputMessage) -> int:
    """The wire type code of a decoded message."""
    return _CODES[type(msg)]


_CODES: dict[type, int] = {
    m.Begin: MessageType.BEGIN, m.Commit: MessageType.COMMIT, m.Origin: MessageType.ORIGIN,
    m.RelationMessage: MessageType.RELATION, m.TypeMessage: MessageType.TYPE,
    m.Insert: MessageType.INSERT, m.Update: MessageType.UPDATE, m.Delete: MessageType.DELETE,
    m.Truncate: MessageType.TRUNCATE, m.Message: MessageType.MESSAGE,
    m.StreamStart: MessageType.STREAM_START, m.StreamStop: MessageType.STREAM_STOP,
    m.StreamCommit: MessageType.STREAM_COMMIT, m.StreamAbort: MessageType.STREAM_ABORT,
    m.BeginPrepare: MessageType.BEGIN_PREPARE, m.Prepare: MessageType.PREPARE,
    m.CommitPrepared: MessageType.COMMIT_PREPARED,
    m.RollbackPrepared: MessageType.ROLLBACK_PREPARED,
    m.StreamPrepare: MessageType.STREAM_PREPARE,
}
