"""pgoutput messages (logical replication protocol versions 1-4) as frozen, slotted dataclasses.

Field names and order follow the PostgreSQL documentation, "Logical Replication Message
Formats" (protocol.sgml, section 55.9 in PostgreSQL 15), and ``logicalrep_write_*`` in
``src/backend/replication/logical/proto.c``. Integers are big-endian on the wire. LSNs are
plain ``int`` (wrap them in :class:`~pgcdc_dagster.cdc.lsn.Lsn` to print ``X/Y``); transaction
ids are unsigned 32-bit; ``*_time`` fields are microseconds since 2000-01-01 00:00 UTC, the
PostgreSQL epoch (:func:`pg_time_to_unix_us` converts them).

Change messages carry an ``xid`` only inside a streamed block (between Stream Start and
Stream Stop, protocol version 2 and later); elsewhere it is ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from pgcdc_dagster.cdc.changes import Relation, Value

PG_EPOCH_UNIX_US = 946_684_800_000_000
"""2000-01-01 00:00:00 UTC in microseconds since the Unix epoch."""


def pg_time_to_unix_us(pg_time: int) -> int:
    """Convert a PostgreSQL timestamp (µs since 2000-01-01) to µs since the Unix epoch."""
    return pg_time + PG_EPOCH_UNIX_US


class MessageType(IntEnum):
    """First byte of every pgoutput message (``LogicalRepMsgType`` in logicalproto.h)."""

    BEGIN = ord("B")
    COMMIT = ord("C")
    ORIGIN = ord("O")
    RELATION = ord("R")
    TYPE = ord("Y")
    INSERT = ord("I")
    UPDATE = ord("U")
    DELETE = ord("D")
    TRUNCATE = ord("T")
    MESSAGE = ord("M")
    STREAM_START = ord("S")
    STREAM_STOP = ord("E")
    STREAM_COMMIT = ord("c")
    STREAM_ABORT = ord("A")
    BEGIN_PREPARE = ord("b")
    PREPARE = ord("P")
    COMMIT_PREPARED = ord("K")
    ROLLBACK_PREPARED = ord("r")
    STREAM_PREPARE = ord("p")

    @property
    def char(self) -> str:
        """The one-letter wire code, e.g. ``'B'``."""
        return chr(self.value)


TRUNCATE_CASCADE = 1
"""Truncate option bit: ``TRUNCATE ... CASCADE``."""
TRUNCATE_RESTART_IDENTITY = 2
"""Truncate option bit: ``TRUNCATE ... RESTART IDENTITY``."""
MESSAGE_TRANSACTIONAL = 1
"""Logical decoding message flag bit: emitted with ``transactional => true``."""


@dataclass(frozen=True, slots=True)
class TupleData:
    """TupleData: one value per column and its kind byte.

    ``kinds`` holds one byte per column: ``n`` NULL, ``u`` unchanged TOAST, ``t`` text,
    ``b`` binary (send format, only with the ``binary`` option). ``values`` holds ``None``,
    :data:`~pgcdc_dagster.cdc.changes.UNCHANGED_TOAST` or the raw bytes.
    """

    kinds: bytes
    values: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Begin:
    """Begin: Int64 final (commit) LSN, Int64 commit time, Int32 xid."""

    final_lsn: int
    commit_time: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit: Int8 flags (unused, 0), Int64 commit LSN, Int64 end LSN, Int64 commit time."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    """Origin: Int64 commit LSN on the origin server, String origin name."""

    origin_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationMessage:
    """Relation: [Int32 xid], Int32 oid, String namespace, String name, Int8 replica identity,
    Int16 column count, then per column Int8 flags (1 = key), String name, Int32 type oid,
    Int32 typmod. The namespace is empty for ``pg_catalog``."""

    xid: int | None
    relation: Relation


@dataclass(frozen=True, slots=True)
class TypeMessage:
    """Type: [Int32 xid], Int32 type oid, String namespace, String type name."""

    xid: int | None
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    """Insert: [Int32 xid], Int32 relation oid, Byte1 'N', TupleData."""

    xid: int | None
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """Update: [Int32 xid], Int32 relation oid, optional Byte1 'K' (key) or 'O' (old row) and
    TupleData, then Byte1 'N' and the new TupleData."""

    xid: int | None
    relation_oid: int
    old_kind: str | None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete: [Int32 xid], Int32 relation oid, Byte1 'K' (key) or 'O' (old row), TupleData."""

    xid: int | None
    relation_oid: int
    old_kind: str
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    """Truncate: [Int32 xid], Int32 relation count, Int8 option bits, Int32 oid per relation."""

    xid: int | None
    options: int
    relation_oids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        """``TRUNCATE ... CASCADE`` was given."""
        return bool(self.options & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        """``TRUNCATE ... RESTART IDENTITY`` was given."""
        return bool(self.options & TRUNCATE_RESTART_IDENTITY)


@dataclass(frozen=True, slots=True)
class Message:
    """Message: [Int32 xid], Int8 flags (1 = transactional), Int64 LSN, String prefix,
    Int32 length, Byte[n] content (``pg_logical_emit_message``)."""

    xid: int | None
    flags: int
    lsn: int
    prefix: str
    content: bytes

    @property
    def transactional(self) -> bool:
        """Emitted with ``transactional => true``."""
        return bool(self.flags & MESSAGE_TRANSACTIONAL)


@dataclass(frozen=True, slots=True)
class StreamStart:
    """Stream Start (v2+): Int32 xid, Int8 1 when this is the first segment of the xid."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """Stream Stop (v2+): no fields."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """Stream Commit (v2+): Int32 xid, Int8 flags (0), Int64 commit LSN, Int64 end LSN,
    Int64 commit time."""

    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """Stream Abort (v2+): Int32 xid, Int32 subtransaction xid (equal to xid when the whole
    transaction aborted); with protocol 4 and ``streaming = parallel`` also Int64 abort LSN
    and Int64 abort time, otherwise those are ``None``."""

    xid: int
    subxid: int
    abort_lsn: int | None
    abort_time: int | None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    """Begin Prepare (v3+): Int64 prepare LSN, Int64 end LSN, Int64 prepare time, Int32 xid,
    String gid."""

    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    """Prepare (v3+): Int8 flags (0), Int64 prepare LSN, Int64 end LSN, Int64 prepare time,
    Int32 xid, String gid."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    """Commit Prepared (v3+): Int8 flags (0), Int64 commit LSN, Int64 end LSN, Int64 commit
    time, Int32 xid, String gid."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    """Rollback Prepared (v3+): Int8 flags (0), Int64 prepare end LSN, Int64 rollback end
    LSN, Int64 prepare time, Int64 rollback time, Int32 xid, String gid."""

    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time: int
    rollback_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    """Stream Prepare (v3+): same fields as Prepare, for a streamed transaction."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


PgOutputMessage = (
    Begin | Commit | Origin | RelationMessage | TypeMessage | Insert | Update | Delete
    | Truncate | Message | StreamStart | StreamStop | StreamCommit | StreamAbort
    | BeginPrepare | Prepare | CommitPrepared | RollbackPrepared | StreamPrepare
)
"""Any decoded pgoutput message."""
