"""Assemble the pgoutput messages of one slot window into a changes.Window.

Fed raw messages in slot order (``feed(lsn, buf, pos, end)``, or whole COPY rows through
:meth:`Assembler.copy_sink`), it keeps only committed work, in commit order:

* ``Begin ... Commit`` goes straight into the window (it is sent once committed).
* Streamed transactions (protocol 2+) are buffered per xid (spilling to disk beyond a
  budget) and emitted at ``Stream Commit`` without their aborted subtransactions; dropped
  at ``Stream Abort`` or when the window ends first (the next peek decodes them again).
* Prepared transactions (protocol 3+) wait for ``Commit Prepared`` (emitted there) or
  ``Rollback Prepared`` (dropped); across windows they live on in :attr:`Assembler.prepared`.

Transactions committed below ``skip_below`` only update the relation map. A streamed
transaction's Relation messages apply at its commit, others' at once, as in pgoutput.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pgcdc_dagster.cdc.changes import Relation, Row, Window
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.pgoutput import messages as m
from pgcdc_dagster.cdc.pgoutput.copyrows import CopySink, SlotRowWriter
from pgcdc_dagster.cdc.pgoutput.errors import code_of, decode_at, message_error
from pgcdc_dagster.cdc.pgoutput.messages import MessageType, pg_time_to_unix_us
from pgcdc_dagster.cdc.pgoutput.pending import PendingSet, PendingTxn, apply_relations, replay
from pgcdc_dagster.cdc.pgoutput.spill import SpillBudget
from pgcdc_dagster.cdc.pgoutput.tuples import WireError
from pgcdc_dagster.exceptions import DecodeError

_BEGIN = struct.Struct(">QqI")  # final LSN, commit time, xid
_COMMIT = struct.Struct(">BQQq")  # flags, commit LSN, end LSN, commit time
_CHANGES = frozenset((0x49, 0x55, 0x44))  # 'I', 'U', 'D'
_BUFFERED = frozenset((0x54, 0x52, 0x59, 0x4D, 0x4F))  # 'T', 'R', 'Y', 'M', 'O'
_DECODE_NOW = frozenset((0x52, 0x4D))  # 'R', 'M'
_IDLE, _DIRECT, _STREAM, _PREPARING = range(4)
_STATE_NAMES = ("outside a transaction", "inside Begin/Commit", "inside a stream block",
                "inside Begin Prepare/Prepare")
DEFAULT_SPILL_BYTES = 256 * 1024 * 1024


class Assembler:
    """Turns one window of pgoutput messages into a :class:`Window` of committed changes."""

    def __init__(
        self,
        *,
        skip_below: int | None = None,
        spill_limit_bytes: int = DEFAULT_SPILL_BYTES,
        spill_dir: str | None = None,
        prepared: dict[str, PendingTxn] | None = None,
        portion_changes: int | None = None,
        on_portion: Callable[[Window], None] | None = None,
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
            portion_changes: with ``on_portion``, hand out the window's rows in portions of
                this many (see :meth:`WindowWriter.set_portions
                <pgcdc_dagster.cdc.pgoutput.writer.WindowWriter.set_portions>`); only
                committed transactions' rows are written, so only those go out.
            on_portion: receives each portion (a Window with ``tables`` only).

        Raises:
            ValueError: only one of ``portion_changes`` and ``on_portion`` given, or
                ``portion_changes`` < 1.
        """
        self._writer = SlotRowWriter()
        if (portion_changes is None) != (on_portion is None):
            raise ValueError("portion_changes and on_portion go together")
        if portion_changes is not None and on_portion is not None:
            self._writer.set_portions(portion_changes, on_portion)
        self._skip_below = skip_below
        self._budget = SpillBudget(spill_limit_bytes, spill_dir)
        self._state = _IDLE
        self._current: PendingTxn | None = None
        self.prepared: dict[str, PendingTxn] = {} if prepared is None else prepared
        self._pending = PendingSet(self._budget, self.prepared)
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
            state = self._state
            if state == _DIRECT and code in _CHANGES:
                self._writer.change(code, lsn, buf, pos + 1, end)
            # Begin and Commit frame every ordinary transaction: no message objects.
            elif code == 0x42 and end - pos == 21 and state == _IDLE:  # 'B'
                final_lsn, commit_time, xid = _BEGIN.unpack_from(buf, pos + 1)
                self._begin_txn(xid, final_lsn, commit_time)
            elif code == 0x43 and end - pos == 26 and state == _DIRECT:  # 'C'
                flags, commit_lsn, end_lsn, _ = _COMMIT.unpack_from(buf, pos + 1)
                self._commit_txn(flags, commit_lsn, end_lsn, lsn)
            else:
                self._other(code, lsn, buf, pos, end)
        except WireError as exc:
            raise message_error(code, exc.what, exc.offset - pos, lsn) from None
        except (IndexError, struct.error) as exc:
            raise message_error(code, f"truncated message of {end - pos} bytes ({exc})",
                                end - pos, lsn) from None

    def decoded_change(self, lsn: int, code: int, oid: int, before: Row | None,
                       key_only: bool, after: Row | None) -> None:
        """Consume an Insert/Update/Delete that another plugin's reader decoded itself
        (``cdc/plugins``): the same rows :meth:`feed` would parse out of the message, without
        encoding them first. Only inside Begin/Commit; see ``WindowWriter.decoded_change``.

        Raises:
            DecodeError: outside a transaction, or no Relation describes ``oid``.
        """
        if self._state != _DIRECT:
            raise message_error(code, f"change {_STATE_NAMES[self._state]}", 0, lsn)
        try:
            self._writer.decoded_change(code, lsn, oid, before, key_only, after)
        except WireError as exc:
            raise message_error(code, exc.what, 1, lsn) from None

    def relation(self, relation: Relation) -> None:
        """Apply a relation description now, as a Relation message of an ordinary
        transaction is (used by other plugins' readers, which describe tables from the
        catalog)."""
        self._writer.relation(relation)

    def _skipped(self, commit_lsn: int) -> bool:
        return self._skip_below is not None and commit_lsn < self._skip_below

    def _other(self, code: int, lsn: int, buf: bytes, pos: int, end: int) -> None:
        state = self._state
        if state == _STREAM or state == _PREPARING:
            pending = self._current
            assert pending is not None
            if code in _CHANGES or code in _BUFFERED:
                if code in _DECODE_NOW:
                    message = decode_at(buf, state == _STREAM, pos, end, lsn)
                    if isinstance(message, m.Message) and not message.transactional:
                        self._message(lsn, message)
                        return
                    if isinstance(message, m.RelationMessage) and state == _PREPARING:
                        self._writer.relation(message.relation)  # pgoutput: schema sent now
                pending.buffer.append(lsn, bytes(buf[pos:end]))
                return
        message = decode_at(buf, state == _STREAM, pos, end, lsn)
        handler = _HANDLERS.get(type(message))
        if handler is None:
            raise message_error(code, f"unexpected {_STATE_NAMES[state]}", 0, lsn)
        handler(self, lsn, message)

    def _begin(self, lsn: int, msg: m.Begin) -> None:
        self._expect(_IDLE, msg, lsn)
        self._begin_txn(msg.xid, msg.final_lsn, msg.commit_time)

    def _begin_txn(self, xid: int, final_lsn: int, commit_time: int) -> None:
        skip = self._skipped(final_lsn)
        self._writer.begin(xid, final_lsn, pg_time_to_unix_us(commit_time), skip)
        self._writer.set_direct(not skip)
        self._state = _DIRECT

    def _commit(self, lsn: int, msg: m.Commit) -> None:
        self._expect(_DIRECT, msg, lsn)
        self._commit_txn(msg.flags, msg.commit_lsn, msg.end_lsn, lsn)

    def _commit_txn(self, flags: int, commit_lsn: int, end_lsn: int, lsn: int) -> None:
        if flags != 0:
            raise message_error(MessageType.COMMIT, f"unknown flags {flags:#04x}", 1, lsn)
        if commit_lsn != self._writer.commit_lsn:
            raise message_error(MessageType.COMMIT, f"commit LSN {Lsn(commit_lsn)} differs "
                                f"from Begin's {Lsn(self._writer.commit_lsn)}", 2, lsn)
        self._writer.end(end_lsn)
        self._writer.set_direct(False)
        self._state = _IDLE

    def _change(self, lsn: int, msg: m.Insert | m.Update | m.Delete) -> None:
        raise message_error(code_of(msg), f"change {_STATE_NAMES[self._state]}", 0, lsn)

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
        self._current = self._ok(self._pending.stream(msg.xid, msg.first_segment), msg, lsn)
        self._state = _STREAM

    def _stream_stop(self, lsn: int, msg: m.StreamStop) -> None:
        self._expect(_STREAM, msg, lsn)
        self._current = None
        self._state = _IDLE

    def _stream_commit(self, lsn: int, msg: m.StreamCommit) -> None:
        self._expect(_IDLE, msg, lsn)
        pending = self._ok(self._pending.pop_stream(msg.xid), msg, lsn)
        self._replay(pending, msg.commit_lsn, msg.end_lsn, msg.commit_time, lsn)

    def _stream_abort(self, lsn: int, msg: m.StreamAbort) -> None:
        self._expect(_IDLE, msg, lsn)
        problem = self._pending.abort(msg.xid, msg.subxid)
        if problem is not None:
            raise message_error(MessageType.STREAM_ABORT, problem, 1, lsn)

    def _begin_prepare(self, lsn: int, msg: m.BeginPrepare) -> None:
        self._expect(_IDLE, msg, lsn)
        self._current = self._pending.begin_prepare(msg.xid, msg.gid)
        self._state = _PREPARING

    def _prepare(self, lsn: int, msg: m.Prepare) -> None:
        self._expect(_PREPARING, msg, lsn)
        assert self._current is not None
        self.prepared[msg.gid] = self._current
        self._current = None
        self._state = _IDLE

    def _stream_prepare(self, lsn: int, msg: m.StreamPrepare) -> None:
        self._expect(_IDLE, msg, lsn)
        pending = self._ok(self._pending.pop_stream(msg.xid), msg, lsn)
        pending.gid = msg.gid
        self.prepared[msg.gid] = pending
        apply_relations(self._writer, pending, self._meta)  # pgoutput: schemas sent now

    def _commit_prepared(self, lsn: int, msg: m.CommitPrepared) -> None:
        self._expect(_IDLE, msg, lsn)
        pending = self.prepared.pop(msg.gid, None)
        if pending is None:
            raise message_error(MessageType.COMMIT_PREPARED, f"transaction {msg.gid!r} was "
                                "prepared in an earlier window and its changes were not carried "
                                "over (pass the previous Assembler.prepared)", 30, lsn)
        self._replay(pending, msg.commit_lsn, msg.end_lsn, msg.commit_time, lsn)

    def _rollback_prepared(self, lsn: int, msg: m.RollbackPrepared) -> None:
        self._expect(_IDLE, msg, lsn)
        self._pending.rollback(msg.gid)

    @staticmethod
    def _ok(result: PendingTxn | str, msg: m.PgOutputMessage, lsn: int) -> PendingTxn:
        if isinstance(result, str):
            raise message_error(code_of(msg), result, 1, lsn)
        return result

    def _replay(self, pending: PendingTxn, commit_lsn: int, end_lsn: int, commit_time: int,
                lsn: int) -> None:
        """Emit a buffered transaction at its commit."""
        replay(self._writer, pending, commit_lsn, end_lsn, commit_time,
               self._skipped(commit_lsn), self._meta)

    def _meta(self, message: m.PgOutputMessage) -> None:
        if isinstance(message, m.TypeMessage):
            self.types[message.oid] = message
        elif isinstance(message, m.Origin):
            self.origin = message

    def _expect(self, state: int, msg: m.PgOutputMessage, lsn: int) -> None:
        if self._state != state:
            raise message_error(code_of(msg), f"unexpected {_STATE_NAMES[self._state]}", 0, lsn)

    def copy_sink(self) -> CopySink:
        """A ``copy_expert`` target that feeds this assembler from a slot-peek COPY."""
        return CopySink(self._writer, self.feed)

    @property
    def portions(self) -> int:
        """Portions handed to ``on_portion`` so far."""
        return self._writer.portions

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
        self.discarded_streams += self._pending.discard_streams()
        return self._writer.window


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
