"""Decode one pgoutput message from bytes (protocol versions 1-4, PostgreSQL 14-17).

Every format below mirrors "Logical Replication Message Formats" in the PostgreSQL
documentation (``doc/src/sgml/protocol.sgml``) and ``logicalrep_write_*`` in
``src/backend/replication/logical/proto.c``; ``>`` because the protocol is big-endian, ``Q``
for LSNs, ``q`` for timestamps, ``I`` for xids and oids (unsigned 32-bit).

A message must be consumed exactly: trailing bytes, a truncated buffer or an unknown
message type raise :class:`~pgcdc_dagster.exceptions.DecodeError` naming the message type
and the byte offset. Changes inside a streamed block carry a leading xid, so the caller says
whether the message comes from inside one (``in_stream``); :class:`Decoder` tracks that.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator

from pgcdc_dagster.cdc.changes import Column, Relation
from pgcdc_dagster.cdc.pgoutput import messages as m
from pgcdc_dagster.cdc.pgoutput.cursor import Cursor
from pgcdc_dagster.cdc.pgoutput.messages import MessageType, PgOutputMessage, TupleData
from pgcdc_dagster.exceptions import DecodeError

_BEGIN = struct.Struct(">QqI")  # final LSN, commit time, xid
_COMMIT = struct.Struct(">BQQq")  # flags, commit LSN, end LSN, commit time
_ORIGIN = struct.Struct(">Q")  # origin commit LSN (then String name)
_XID = struct.Struct(">I")  # relation oid, type oid, message length
_REL_TAIL = struct.Struct(">Bh")  # replica identity, column count
_COLUMN = struct.Struct(">Ii")  # type oid, typmod (after Int8 flags and String name)
_TRUNCATE = struct.Struct(">IB")  # relation count, option bits
_MESSAGE = struct.Struct(">BQ")  # flags, LSN (then String prefix, Int32 length, content)
_STREAM_START = struct.Struct(">IB")  # xid, first segment
_STREAM_COMMIT = struct.Struct(">IBQQq")  # xid, flags, commit LSN, end LSN, commit time
_STREAM_ABORT = struct.Struct(">II")  # xid, subtransaction xid
_ABORT_INFO = struct.Struct(">Qq")  # v4 parallel streaming: abort LSN, abort time
_BEGIN_PREPARE = struct.Struct(">QQqI")  # prepare LSN, end LSN, prepare time, xid
_PREPARE = struct.Struct(">BQQqI")  # flags, prepare/commit LSN, end LSN, time, xid
_ROLLBACK_PREPARED = struct.Struct(">BQQqqI")  # flags, prep end, rb end, prep t, rb t, xid


def _begin(c: Cursor, in_stream: bool) -> PgOutputMessage:
    return m.Begin(*c.unpack(_BEGIN))


def _commit(c: Cursor, in_stream: bool) -> PgOutputMessage:
    return m.Commit(*c.unpack(_COMMIT))


def _origin(c: Cursor, in_stream: bool) -> PgOutputMessage:
    (lsn,) = c.unpack(_ORIGIN)
    return m.Origin(lsn, c.string())


def _relation(c: Cursor, in_stream: bool) -> PgOutputMessage:
    xid = c.stream_xid(in_stream)
    (oid,) = c.unpack(_XID)
    namespace, name = c.string(), c.string()
    identity, ncols = c.unpack(_REL_TAIL)
    if ncols < 0:
        raise c.error(f"negative column count {ncols}")
    columns = []
    for _ in range(ncols):
        flags = c.byte()
        col_name = c.string()
        type_oid, typmod = c.unpack(_COLUMN)
        columns.append(Column(col_name, type_oid, typmod, bool(flags & 1)))
    relation = Relation(oid, namespace, name, chr(identity), tuple(columns))
    return m.RelationMessage(xid, relation)


def _type(c: Cursor, in_stream: bool) -> PgOutputMessage:
    xid = c.stream_xid(in_stream)
    (oid,) = c.unpack(_XID)
    return m.TypeMessage(xid, oid, c.string(), c.string())


def _insert(c: Cursor, in_stream: bool) -> PgOutputMessage:
    xid = c.stream_xid(in_stream)
    (oid,) = c.unpack(_XID)
    if (kind := c.byte()) != ord("N"):
        raise c.error(f"expected 'N' before the new tuple, found {kind:#04x}", c.pos - 1)
    return m.Insert(xid, oid, c.tuple_data())


def _update(c: Cursor, in_stream: bool) -> PgOutputMessage:
    xid = c.stream_xid(in_stream)
    (oid,) = c.unpack(_XID)
    kind = c.byte()
    old_kind: str | None = None
    old: TupleData | None = None
    if kind in (ord("K"), ord("O")):
        old_kind, old = chr(kind), c.tuple_data()
        kind = c.byte()
    if kind != ord("N"):
        raise c.error(f"expected 'K', 'O' or 'N', found {kind:#04x}", c.pos - 1)
    return m.Update(xid, oid, old_kind, old, c.tuple_data())


def _delete(c: Cursor, in_stream: bool) -> PgOutputMessage:
    xid = c.stream_xid(in_stream)
    (oid,) = c.unpack(_XID)
    kind = c.byte()
    if kind not in (ord("K"), ord("O")):
        raise c.error(f"expected 'K' or 'O', found {kind:#04x}", c.pos - 1)
    return m.Delete(xid, oid, chr(kind), c.tuple_data())


def _truncate(c: Cursor, in_stream: bool) -> PgOutputMessage:
    xid = c.stream_xid(in_stream)
    count, options = c.unpack(_TRUNCATE)
    oids = c.unpack(struct.Struct(f">{count}I")) if count < 1 << 20 else ()
    if len(oids) != count:
        raise c.error(f"implausible relation count {count}")
    return m.Truncate(xid, options, oids)


def _message(c: Cursor, in_stream: bool) -> PgOutputMessage:
    xid = c.stream_xid(in_stream)
    flags, lsn = c.unpack(_MESSAGE)
    prefix = c.string()
    (length,) = c.unpack(_XID)
    return m.Message(xid, flags, lsn, prefix, c.take(length))


def _stream_start(c: Cursor, in_stream: bool) -> PgOutputMessage:
    xid, first = c.unpack(_STREAM_START)
    return m.StreamStart(xid, bool(first))


def _stream_stop(c: Cursor, in_stream: bool) -> PgOutputMessage:
    return m.StreamStop()


def _stream_commit(c: Cursor, in_stream: bool) -> PgOutputMessage:
    return m.StreamCommit(*c.unpack(_STREAM_COMMIT))


def _stream_abort(c: Cursor, in_stream: bool) -> PgOutputMessage:
    xid, subxid = c.unpack(_STREAM_ABORT)
    if c.pos == c.end:
        return m.StreamAbort(xid, subxid, None, None)
    # Protocol 4 with streaming = parallel appends the abort LSN and time.
    lsn, time = c.unpack(_ABORT_INFO)
    return m.StreamAbort(xid, subxid, lsn, time)


def _begin_prepare(c: Cursor, in_stream: bool) -> PgOutputMessage:
    lsn, end_lsn, time, xid = c.unpack(_BEGIN_PREPARE)
    return m.BeginPrepare(lsn, end_lsn, time, xid, c.string())


def _prepare(c: Cursor, in_stream: bool) -> PgOutputMessage:
    flags, lsn, end_lsn, time, xid = c.unpack(_PREPARE)
    return m.Prepare(flags, lsn, end_lsn, time, xid, c.string())


def _commit_prepared(c: Cursor, in_stream: bool) -> PgOutputMessage:
    flags, lsn, end_lsn, time, xid = c.unpack(_PREPARE)
    return m.CommitPrepared(flags, lsn, end_lsn, time, xid, c.string())


def _rollback_prepared(c: Cursor, in_stream: bool) -> PgOutputMessage:
    flags, prepare_end, rollback_end, prepare_time, rollback_time, xid = c.unpack(
        _ROLLBACK_PREPARED)
    return m.RollbackPrepared(flags, prepare_end, rollback_end, prepare_time, rollback_time,
                              xid, c.string())


def _stream_prepare(c: Cursor, in_stream: bool) -> PgOutputMessage:
    flags, lsn, end_lsn, time, xid = c.unpack(_PREPARE)
    return m.StreamPrepare(flags, lsn, end_lsn, time, xid, c.string())


_DISPATCH: dict[int, Callable[[Cursor, bool], PgOutputMessage]] = {
    MessageType.BEGIN: _begin,
    MessageType.COMMIT: _commit,
    MessageType.ORIGIN: _origin,
    MessageType.RELATION: _relation,
    MessageType.TYPE: _type,
    MessageType.INSERT: _insert,
    MessageType.UPDATE: _update,
    MessageType.DELETE: _delete,
    MessageType.TRUNCATE: _truncate,
    MessageType.MESSAGE: _message,
    MessageType.STREAM_START: _stream_start,
    MessageType.STREAM_STOP: _stream_stop,
    MessageType.STREAM_COMMIT: _stream_commit,
    MessageType.STREAM_ABORT: _stream_abort,
    MessageType.BEGIN_PREPARE: _begin_prepare,
    MessageType.PREPARE: _prepare,
    MessageType.COMMIT_PREPARED: _commit_prepared,
    MessageType.ROLLBACK_PREPARED: _rollback_prepared,
    MessageType.STREAM_PREPARE: _stream_prepare,
}


def decode(
    buf: bytes, *, in_stream: bool = False, pos: int = 0, end: int | None = None,
) -> PgOutputMessage:
    """Decode the single pgoutput message in ``buf[pos:end]``.

    Args:
        buf: the message bytes (one row of ``pg_logical_slot_*_binary_changes``, or the
            payload of one XLogData message).
        in_stream: the message lies between Stream Start and Stream Stop, so change,
            Relation, Type and Message messages carry a leading xid.
        pos: where the message starts in ``buf``.
        end: where it ends (default ``len(buf)``); it must be consumed exactly.

    Returns:
        The typed message.

    Raises:
        DecodeError: empty, truncated or malformed buffer, unknown message type, or
            trailing bytes; the message names the type and the byte offset.
    """
    end = len(buf) if end is None else end
    if pos >= end:
        raise DecodeError(f"empty pgoutput message at byte offset {pos}")
    code = buf[pos]
    handler = _DISPATCH.get(code)
    if handler is None:
        raise DecodeError(
            f"unknown pgoutput message type {chr(code)!r} ({code:#04x}) at byte offset 0")
    cursor = Cursor(buf, pos, end, MessageType(code))
    message = handler(cursor, in_stream)
    cursor.finish()
    return message


class Decoder:
    """Stateful decoder for a sequence of messages: tracks Stream Start / Stream Stop."""

    def __init__(self) -> None:
        self.in_stream = False

    def decode(self, buf: bytes) -> PgOutputMessage:
        """Decode the next message; see :func:`decode`.

        Raises:
            DecodeError: as :func:`decode`, or a Stream Start inside a stream / a Stream
                Stop outside one.
        """
        message = decode(buf, in_stream=self.in_stream)
        if isinstance(message, m.StreamStart):
            if self.in_stream:
                raise DecodeError("pgoutput STREAM_START message ('S') inside an open stream "
                                  "at byte offset 0")
            self.in_stream = True
        elif isinstance(message, m.StreamStop):
            if not self.in_stream:
                raise DecodeError("pgoutput STREAM_STOP message ('E') without a stream "
                                  "at byte offset 0")
            self.in_stream = False
        return message


def decode_all(payloads: Iterable[bytes]) -> Iterator[PgOutputMessage]:
    """Decode a sequence of messages in order, tracking streamed blocks."""
    decoder = Decoder()
    for payload in payloads:
        yield decoder.decode(payload)
