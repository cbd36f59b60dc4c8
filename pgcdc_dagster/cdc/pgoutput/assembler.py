"""Assemble the pgoutput messages of one slot window into a changes.Window.

The assembler is fed raw messages in slot order (``feed(lsn, buf, pos, end)``) and keeps
only committed work, in commit order:

* ``Begin ... Commit``: written straight into the window (PostgreSQL sends a transaction
  only once it committed, so nothing needs buffering).
* Streamed transactions (protocol 2+, ``Stream Start ... Stream Stop`` blocks): buffered
  per top-level xid, spilled to disk beyond the budget, emitted at ``Stream Commit`` with
  the changes of aborted subtransactions (``Stream Abort`` with a subxid) removed;
  dropped on a top-level ``Stream Abort``; dropped if the window ends before their commit
  (the next peek decodes them again from the slot's restart point).
* Two-phase transactions (protocol 3+): ``Begin Prepare ... Prepare`` or ``Stream Prepare``
  are held until ``Commit Prepared`` (emitted there, with its commit LSN and time) or
  ``Rollback Prepared`` (dropped). A prepared transaction whose commit falls in a later
  window stays in :attr:`Assembler.prepared`; pass that mapping to the next window's
  assembler (the prepare is not sent again once the slot has moved past it).

Transactions whose commit LSN is below ``skip_below`` are decoded for their Relation
messages only and produce no events (exactly-once restarts). Relation messages of a
streamed transaction take effect when it commits, those of an ordinary or prepared one at
once, mirroring when pgoutput considers a schema "sent".
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pgcdc_dagster.cdc.changes import Window
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.pgoutput import messages as m
from pgcdc_dagster.cdc.pgoutput.decoder import decode
from pgcdc_dagster.cdc.pgoutput.messages import MessageType, pg_time_to_unix_us
from pgcdc_dagster.cdc.pgoutput.spill import SpillBudget, TxnBuffer
from pgcdc_dagster.cdc.pgoutput.tuples import WireError
from pgcdc_dagster.cdc.pgoutput.writer import WindowWriter
from pgcdc_dagster.exceptions import DecodeError

_u32 = struct.Struct(">I").unpack_from
_CHANGES = frozenset((0x49, 0x55, 0x44))  # 'I', 'U', 'D'
_BUFFERED = frozenset((0x54, 0x52, 0x59, 0x4D, 0x4F))  # 'T', 'R', 'Y', 'M', 'O'
_DECODE_NOW = frozenset((0x52, 0x4D))  # 'R', 'M'
_IDLE, _DIRECT, _STREAM, _PREPARING = range(4)
_STATE_NAMES = ("outside a transaction", "inside Begin/Commit", "inside a stream block",
                "inside Begin Prepare/Prepare")
DEFAULT_SPILL_BYTES = 256 * 1024 * 1024


@dataclass(slots=True)
class PendingTxn:
    """A transaction buffered until its outcome is known (streamed and/or prepared)."""

    xid: int
    buffer: TxnBuffer
    streamed: bool
    """Messages carry the (sub)transaction xid after the type byte."""
    aborted_subxids: set[int] = field(default_factory=set)
    gid: str | None = None


class Assembler:
    """Turns one window of pgoutput messages into a :class:`Window` of committed changes."""

    def __init__(
        self,
        *,
        skip_below: int | None = None,
        spill_limit_bytes: int = DEFAULT_SPILL_BYTES,
        spill_dir: str | None = None,
        prepared: dict[str, PendingTxn] | None = None,
    ) -> None:
        """Create an assembler for one window.

        Args:
            skip_below: drop transactions (and non-transactional messages) whose commit LSN
                is below this LSN: they were already delivered by an earlier window.
            spill_limit_bytes: memory budget of all buffered streamed/prepared transactions;
                beyond it the largest is written to a temporary file.
            spill_dir: directory for spill files (default: the system temp dir).
            prepared: prepared transactions left open by the previous window (its
                :attr:`prepared`); updated in place.
        """
        self._writer = WindowWriter()
        self._skip_below = skip_below
        self._budget = SpillBudget(spill_limit_bytes, spill_dir)
        self._state = _IDLE
        self._streams: dict[int, PendingTxn] = {}
        self._current: PendingTxn | None = None
        self.prepared: dict[str, PendingTxn] = {} if prepared is None else prepared
        self.types: dict[int, m.TypeMessage] = {}
        """Type messages seen (user-defined column types), by type oid."""
        self.origin: m.Origin | None = None
        """Origin of the last transaction that had one."""
        self.discarded_streams: list[int] = []
        """Xids of streamed transactions still open when the window ended."""

    @property
    def spilled_bytes(self) -> int:
        """Bytes of buffered transactions written to temporary files so far."""
        return self._budget.spilled_bytes

    def feed(self, lsn: int, buf: bytes, pos: int = 0, end: int | None = None) -> None:
        """Consume the message ``buf[pos:end]`` that the slot returned at ``lsn``.

        Raises:
            DecodeError: malformed message, unknown type, undescribed relation, or a
                message that cannot occur in the current state; names type and offset.
        """
        if end is None:
            end = len(buf)
        code = -1
        try:
            code = buf[pos]
            if self._state == _DIRECT and code in _CHANGES:
                self._writer.change(code, lsn, buf, pos + 1, end)
            else:
                self._other(code, lsn, buf, pos, end)
        except WireError as exc:
            raise _error(code, exc.what, exc.offset - pos, lsn) from None
        except (IndexError, struct.error) as exc:
            raise _error(code, f"truncated message of {end - pos} bytes ({exc})", end - pos,
                         lsn) from None

    def _skipped(self, commit_lsn: int) -> bool:
        return self._skip_below is not None and commit_lsn < self._skip_below

    def _other(self, code: int, lsn: int, buf: bytes, pos: int, end: int) -> None:
        state = self._state
        if state == _STREAM or state == _PREPARING:
            pending = self._current
            assert pending is not None
            if code in _CHANGES or code in _BUFFERED:
                if code in _DECODE_NOW:
                    message = _decode(buf, state == _STREAM, pos, end, lsn)
                    if isinstance(message, m.Message) and not message.transactional:
                        self._message(lsn, message)
                        return
                    if isinstance(message, m.RelationMessage) and state == _PREPARING:
                        self._writer.relation(message.relation)  # pgoutput: schema sent now
                pending.buffer.append(lsn, bytes(buf[pos:end]))
                return
        message = _decode(buf, state == _STREAM, pos, end, lsn)
        handler = _HANDLERS.get(type(message))
        if handler is None:
            raise _error(code, f"unexpected {_STATE_NAMES[state]}", 0, lsn)
        handler(self, lsn, message)

    def _begin(self, lsn: int, msg: m.Begin) -> None:
        self._expect(_IDLE, msg, lsn)
        skip = self._skipped(msg.final_lsn)
        self._writer.begin(msg.xid, msg.final_lsn, pg_time_to_unix_us(msg.commit_time), skip)
        self._state = _DIRECT

    def _commit(self, lsn: int, msg: m.Commit) -> None:
        self._expect(_DIRECT, msg, lsn)
        if msg.commit_lsn != self._writer.commit_lsn:
            raise _error(MessageType.COMMIT, f"commit LSN {Lsn(msg.commit_lsn)} differs from "
                         f"Begin's {Lsn(self._writer.commit_lsn)}", 2, lsn)
        self._writer.end(msg.end_lsn)
        self._state = _IDLE

    def _change(self, lsn: int, msg: m.Insert | m.Update | m.Delete) -> None:
        raise _error(_code_of(msg), f"change {_STATE_NAMES[self._state]}", 0, lsn)

    def _truncate(self, lsn: int, msg: m.Truncate) -> None:
        self._expect(_DIRECT, msg, lsn)
        self._writer.truncate(lsn, msg.relation_oids, msg.options)

    def _message(self, lsn: int, msg: m.Message) -> None:
        if not msg.transactional:
            if not self._skipped(msg.lsn):
                self._writer.nontransactional_message(msg.lsn, msg.prefix, msg.content)
            return
        self._expect(_DIRECT, msg, lsn)
        self._writer.message(msg.lsn, msg.prefix, msg.content)

    def _relation(self, lsn: int, msg: m.RelationMessage) -> None:
        self._writer.relation(msg.relation)

    def _type(self, lsn: int, msg: m.TypeMessage) -> None:
        self.types[msg.oid] = msg

    def _origin(self, lsn: int, msg: m.Origin) -> None:
        self.origin = msg

    def _stream_start(self, lsn: int, msg: m.StreamStart) -> None:
        self._expect(_IDLE, msg, lsn)
        pending = self._streams.get(msg.xid)
        if pending is None:
            if not msg.first_segment:
                raise _error(MessageType.STREAM_START, f"continues xid {msg.xid} whose first "
                             "segment was not in this window", 1, lsn)
            pending = self._streams[msg.xid] = PendingTxn(
                msg.xid, self._budget.new_buffer(), streamed=True)
        elif msg.first_segment:
            raise _error(MessageType.STREAM_START, f"first segment of xid {msg.xid} again",
                         5, lsn)
        self._current = pending
        self._state = _STREAM

    def _stream_stop(self, lsn: int, msg: m.StreamStop) -> None:
        self._expect(_STREAM, msg, lsn)
        self._current = None
        self._state = _IDLE

    def _stream_commit(self, lsn: int, msg: m.StreamCommit) -> None:
        self._expect(_IDLE, msg, lsn)
        pending = self._pop_stream(msg.xid, MessageType.STREAM_COMMIT, lsn)
        self._replay(pending, msg.commit_lsn, msg.end_lsn, msg.commit_time, lsn)

    def _stream_abort(self, lsn: int, msg: m.StreamAbort) -> None:
        self._expect(_IDLE, msg, lsn)
        if msg.xid == msg.subxid:
            self._pop_stream(msg.xid, MessageType.STREAM_ABORT, lsn).buffer.close()
        elif msg.xid in self._streams:
            self._streams[msg.xid].aborted_subxids.add(msg.subxid)
        else:
            raise _error(MessageType.STREAM_ABORT, f"subtransaction {msg.subxid} of xid "
                         f"{msg.xid}, which was not streamed in this window", 1, lsn)

    def _begin_prepare(self, lsn: int, msg: m.BeginPrepare) -> None:
        self._expect(_IDLE, msg, lsn)
        self._current = PendingTxn(msg.xid, self._budget.new_buffer(), streamed=False,
                                   gid=msg.gid)
        self._state = _PREPARING

    def _prepare(self, lsn: int, msg: m.Prepare) -> None:
        self._expect(_PREPARING, msg, lsn)
        assert self._current is not None
        self.prepared[msg.gid] = self._current
        self._current = None
        self._state = _IDLE

    def _stream_prepare(self, lsn: int, msg: m.StreamPrepare) -> None:
        self._expect(_IDLE, msg, lsn)
        pending = self._pop_stream(msg.xid, MessageType.STREAM_PREPARE, lsn)
        pending.gid = msg.gid
        self.prepared[msg.gid] = pending
        for item_lsn, data in pending.buffer:  # pgoutput marks these schemas sent now
            if data[0] == MessageType.RELATION:
                self._replay_one(pending, item_lsn, data)

    def _commit_prepared(self, lsn: int, msg: m.CommitPrepared) -> None:
        self._expect(_IDLE, msg, lsn)
        pending = self.prepared.pop(msg.gid, None)
        if pending is None:
            raise _error(MessageType.COMMIT_PREPARED, f"transaction {msg.gid!r} was prepared "
                         "in an earlier window and its changes were not carried over (pass "
                         "the previous Assembler.prepared)", 30, lsn)
        self._replay(pending, msg.commit_lsn, msg.end_lsn, msg.commit_time, lsn)

    def _rollback_prepared(self, lsn: int, msg: m.RollbackPrepared) -> None:
        self._expect(_IDLE, msg, lsn)
        pending = self.prepared.pop(msg.gid, None)
        if pending is not None:
            pending.buffer.close()

    def _pop_stream(self, xid: int, code: int, lsn: int) -> PendingTxn:
        pending = self._streams.pop(xid, None)
        if pending is None:
            raise _error(code, f"xid {xid} was not streamed in this window", 1, lsn)
        return pending

    def _replay(self, pending: PendingTxn, commit_lsn: int, end_lsn: int, commit_time: int,
                lsn: int) -> None:
        """Emit a buffered transaction at its commit."""
        writer = self._writer
        writer.begin(pending.xid, commit_lsn, pg_time_to_unix_us(commit_time),
                     self._skipped(commit_lsn))
        try:
            for item_lsn, data in pending.buffer:
                self._replay_one(pending, item_lsn, data)
        finally:
            pending.buffer.close()
        writer.end(end_lsn)

    def _replay_one(self, pending: PendingTxn, lsn: int, data: bytes) -> None:
        code = data[0]
        try:
            if pending.streamed and code != MessageType.RELATION and code != MessageType.TYPE \
                    and code != MessageType.ORIGIN and _u32(data, 1)[0] in pending.aborted_subxids:
                return
            if code in _CHANGES:
                self._writer.change(code, lsn, data, 5 if pending.streamed else 1, len(data))
                return
        except WireError as exc:
            raise _error(code, exc.what, exc.offset, lsn) from None
        except (IndexError, struct.error) as exc:
            raise _error(code, f"truncated message of {len(data)} bytes ({exc})", len(data),
                         lsn) from None
        message = _decode(data, pending.streamed, 0, len(data), lsn)
        if isinstance(message, m.Truncate):
            self._writer.truncate(lsn, message.relation_oids, message.options)
        elif isinstance(message, m.Message):  # only transactional ones are buffered
            self._writer.message(message.lsn, message.prefix, message.content)
        elif isinstance(message, m.RelationMessage):
            self._writer.relation(message.relation)
        elif isinstance(message, m.TypeMessage):
            self.types[message.oid] = message
        elif isinstance(message, m.Origin):
            self.origin = message

    def _expect(self, state: int, msg: m.PgOutputMessage, lsn: int) -> None:
        if self._state != state:
            raise _error(_code_of(msg), f"unexpected {_STATE_NAMES[self._state]}", 0, lsn)

    def finish(self) -> Window:
        """End the window and return it.

        Streamed transactions without a commit are dropped (recorded in
        :attr:`discarded_streams`); prepared ones stay in :attr:`prepared`.

        Raises:
            DecodeError: the window ended inside Begin/Commit, a stream block, or
                Begin Prepare/Prepare: the input was cut short.
        """
        if self._state != _IDLE:
            raise DecodeError(f"pgoutput window ended {_STATE_NAMES[self._state]}: the "
                              "message sequence is incomplete")
        for xid, pending in self._streams.items():
            pending.buffer.close()
            self.discarded_streams.append(xid)
        self._streams.clear()
        return self._writer.window


def _decode(buf: bytes, in_stream: bool, pos: int, end: int, lsn: int) -> m.PgOutputMessage:
    try:
        return decode(buf, in_stream=in_stream, pos=pos, end=end)
    except DecodeError as exc:
        raise DecodeError(f"{exc} (slot row at LSN {Lsn(lsn)})") from None


def _code_of(msg: m.PgOutputMessage) -> int:
    return _CODES[type(msg)]


def _error(code: int, what: str, offset: int, lsn: int) -> DecodeError:
    try:
        kind = MessageType(code)
        name = f"{kind.name} message ('{kind.char}')"
    except ValueError:
        name = f"message of unknown type {code:#04x}" if code >= 0 else "empty message"
    return DecodeError(f"pgoutput {name} at LSN {Lsn(lsn)}: {what} at byte offset {offset}")


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

_HANDLERS: dict[type, Callable[[Assembler, int, Any], None]] = {
    m.Begin: Assembler._begin, m.Commit: Assembler._commit, m.Origin: Assembler._origin,
    m.RelationMessage: Assembler._relation, m.TypeMessage: Assembler._type,
    m.Insert: Assembler._change, m.Update: Assembler._change, m.Delete: Assembler._change,
    m.Truncate: Assembler._truncate, m.Message: Assembler._message,
    m.StreamStart: Assembler._stream_start, m.StreamStop: Assembler._stream_stop,
    m.StreamCommit: Assembler._stream_commit, m.StreamAbort: Assembler._stream_abort,
    m.BeginPrepare: Assembler._begin_prepare, m.Prepare: Assembler._prepare,
    m.CommitPrepared: Assembler._commit_prepared,
    m.RollbackPrepared: Assembler._rollback_prepared,
    m.StreamPrepare: Assembler._stream_prepare,
}


def assemble(
    items: list[tuple[int, bytes]], *, skip_below: int | None = None,
) -> Window:
    """Assemble a whole window held in memory: ``(lsn, message bytes)`` pairs in slot order.

    Raises:
        DecodeError: see :meth:`Assembler.feed` and :meth:`Assembler.finish`.
    """
    assembler = Assembler(skip_below=skip_below)
    for lsn, data in items:
        assembler.feed(lsn, data)
    return assembler.finish()
