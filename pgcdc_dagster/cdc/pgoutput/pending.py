"""Transactions held back until their outcome is known: streamed and prepared ones.

A streamed transaction (protocol 2+) arrives in Stream Start/Stop blocks, interleaved with
other transactions, and may still abort; a prepared one (protocol 3+) may still be rolled
back. :class:`PendingTxn` keeps such a transaction's raw messages in a spillable
:class:`~pgcdc_dagster.cdc.pgoutput.spill.TxnBuffer`; :func:`replay` writes it into the
window at its commit, leaving out the changes of aborted subtransactions.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from pgcdc_dagster.cdc.pgoutput import messages as m
from pgcdc_dagster.cdc.pgoutput.errors import decode_at, message_error
from pgcdc_dagster.cdc.pgoutput.messages import MessageType, pg_time_to_unix_us
from pgcdc_dagster.cdc.pgoutput.spill import SpillBudget, TxnBuffer
from pgcdc_dagster.cdc.pgoutput.tuples import WireError
from pgcdc_dagster.cdc.pgoutput.writer import WindowWriter

_u32 = struct.Struct(">I").unpack_from
_CHANGES = frozenset((MessageType.INSERT, MessageType.UPDATE, MessageType.DELETE))
_NO_XID = frozenset((MessageType.RELATION, MessageType.TYPE, MessageType.ORIGIN))
"""Buffered messages never dropped with an aborted subtransaction: pgoutput counts a
Relation or Type as sent for the whole top-level transaction, and Origin has no xid."""


@dataclass(slots=True)
class PendingTxn:
    """A transaction buffered until its outcome is known (streamed and/or prepared)."""

    xid: int
    buffer: TxnBuffer
    streamed: bool
    """Messages carry the (sub)transaction xid after the type byte."""
    aborted_subxids: set[int] = field(default_factory=set)
    gid: str | None = None


class PendingSet:
    """The streamed transactions in flight in a window and the prepared ones (by gid).

    Methods return an error text instead of raising, so the assembler can name the message
    and LSN.
    """

    def __init__(self, budget: SpillBudget, prepared: dict[str, PendingTxn]) -> None:
        self.budget = budget
        self.streams: dict[int, PendingTxn] = {}
        self.prepared = prepared

    def stream(self, xid: int, first_segment: bool) -> PendingTxn | str:
        """The transaction a Stream Start opens a block of."""
        pending = self.streams.get(xid)
        if pending is None:
            if not first_segment:
                return f"continues xid {xid} whose first segment was not in this window"
            pending = self.streams[xid] = PendingTxn(xid, self.budget.new_buffer(), True)
        elif first_segment:
            return f"first segment of xid {xid} again"
        return pending

    def pop_stream(self, xid: int) -> PendingTxn | str:
        """Remove a streamed transaction at its Stream Commit, Abort or Prepare."""
        pending = self.streams.pop(xid, None)
        return f"xid {xid} was not streamed in this window" if pending is None else pending

    def abort(self, xid: int, subxid: int) -> str | None:
        """Apply a Stream Abort: drop the transaction or mark the subtransaction."""
        if xid == subxid:
            pending = self.pop_stream(xid)
            if isinstance(pending, str):
                return pending
            pending.buffer.close()
        elif xid in self.streams:
            self.streams[xid].aborted_subxids.add(subxid)
        else:
            return f"subtransaction {subxid} of xid {xid}, which was not streamed in this window"
        return None

    def begin_prepare(self, xid: int, gid: str) -> PendingTxn:
        """A new (non-streamed) transaction between Begin Prepare and Prepare."""
        return PendingTxn(xid, self.budget.new_buffer(), False, gid=gid)

    def rollback(self, gid: str) -> None:
        """Rollback Prepared: forget the transaction (it may be from an earlier window)."""
        pending = self.prepared.pop(gid, None)
        if pending is not None:
            pending.buffer.close()

    def discard_streams(self) -> list[int]:
        """Drop the streamed transactions still open at the end of the window."""
        xids = list(self.streams)
        for pending in self.streams.values():
            pending.buffer.close()
        self.streams.clear()
        return xids


def replay(
    writer: WindowWriter, pending: PendingTxn, commit_lsn: int, end_lsn: int,
    commit_time: int, skip: bool, on_meta: Callable[[m.PgOutputMessage], None],
) -> None:
    """Write a buffered transaction into the window as committed at ``commit_lsn``.

    Raises:
        DecodeError: a buffered message is malformed (named with its LSN).
    """
    writer.begin(pending.xid, commit_lsn, pg_time_to_unix_us(commit_time), skip)
    try:
        for lsn, data in pending.buffer:
            replay_one(writer, pending, lsn, data, on_meta)
    finally:
        pending.buffer.close()
    writer.end(end_lsn)


def replay_one(
    writer: WindowWriter, pending: PendingTxn, lsn: int, data: bytes,
    on_meta: Callable[[m.PgOutputMessage], None],
) -> None:
    """Apply one buffered message (Relation and Type go to ``on_meta`` as well).

    Raises:
        DecodeError: the message is malformed.
    """
    code = data[0]
    try:
        if pending.streamed and code not in _NO_XID \
                and _u32(data, 1)[0] in pending.aborted_subxids:
            return
        if code in _CHANGES:
            writer.change(code, lsn, data, 5 if pending.streamed else 1, len(data))
            return
    except WireError as exc:
        raise message_error(code, exc.what, exc.offset, lsn) from None
    except (IndexError, struct.error) as exc:
        raise message_error(code, f"truncated message of {len(data)} bytes ({exc})",
                            len(data), lsn) from None
    message = decode_at(data, pending.streamed, 0, len(data), lsn)
    if isinstance(message, m.Truncate):
        writer.truncate(lsn, message.relation_oids, message.options)
    elif isinstance(message, m.Message):  # only transactional ones are buffered
        writer.message(message.lsn, message.prefix, message.content)
    elif isinstance(message, m.RelationMessage):
        writer.relation(message.relation)
    else:
        on_meta(message)


def apply_relations(
    writer: WindowWriter, pending: PendingTxn, on_meta: Callable[[m.PgOutputMessage], None],
) -> None:
    """Apply only the Relation messages of a buffered transaction (at Stream Prepare,
    pgoutput considers them sent)."""
    for lsn, data in pending.buffer:
        if data[0] == MessageType.RELATION:
            replay_one(writer, pending, lsn, data, on_meta)
