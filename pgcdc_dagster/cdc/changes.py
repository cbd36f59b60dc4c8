"""The contract between the stream decoder and the sinks: relations and columnar change batches.

The pgoutput decoder and transaction assembler (``cdc.pgoutput``) produce a :class:`Window`;
the lake writers turn its :class:`TableChanges` segments into Arrow and Delta. Values are
kept exactly as pgoutput sends them in text mode (``bytes`` holding the type's text output),
``None`` for SQL NULL, or :data:`UNCHANGED_TOAST` for an unchanged out-of-line value (tuple
kind ``'u'``). Type conversion happens later, column-at-a-time, in ``cdc.typeconv``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final


class _UnchangedToast:
    """Sentinel for pgoutput tuple kind 'u': the value is unchanged TOAST and was not sent."""

    __slots__ = ()
    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _UnchangedToast()

Value = bytes | None | _UnchangedToast
"""One column value: text-format bytes, None for NULL, or UNCHANGED_TOAST."""

Row = tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Column:
    """A column as described by a pgoutput Relation message."""

    name: str
    type_oid: int
    typmod: int
    is_key: bool
    """Part of the replica identity key (pgoutput column flag 1)."""


@dataclass(frozen=True, slots=True)
class Relation:
    """A table as described by a pgoutput Relation message ('R')."""

    oid: int
    namespace: str
    name: str
    replica_identity: str
    """'d' default, 'n' nothing, 'f' full, 'i' index."""
    columns: tuple[Column, ...]

    @property
    def qualified(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def key_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.is_key)


@dataclass(slots=True)
class TableChanges:
    """Row events of one table within a window, in commit order, under one relation shape.

    A new segment starts whenever the table's Relation message changes (schema change),
    so every row tuple in a segment matches ``relation.columns``.

    ``op`` is one of 'c' (insert), 'u' (update), 'd' (delete), 't' (truncate; both images
    None). ``before`` is the old tuple when pgoutput sent one ('K' key-only: non-key columns
    are None; 'O' full old row); otherwise None.
    """

    relation: Relation
    op: list[str] = field(default_factory=list)
    commit_lsn: list[int] = field(default_factory=list)
    lsn: list[int] = field(default_factory=list)
    """LSN of the change record itself (Debezium ``source.lsn``)."""
    xid: list[int] = field(default_factory=list)
    commit_ts_us: list[int] = field(default_factory=list)
    """Commit time, microseconds since the Unix epoch (Debezium ``source.ts_ms`` * 1000)."""
    total_order: list[int] = field(default_factory=list)
    """1-based position of the event among all events of its transaction."""
    collection_order: list[int] = field(default_factory=list)
    """1-based position of the event among this table's events in its transaction."""
    before: list[Row | None] = field(default_factory=list)
    before_key_only: list[bool] = field(default_factory=list)
    """True when ``before`` came from a 'K' (key columns only) old tuple."""
    after: list[Row | None] = field(default_factory=list)
    truncate_options: list[int] = field(default_factory=list)
    """For 't' rows: pgoutput option bits (1 CASCADE, 2 RESTART IDENTITY); 0 otherwise."""
    snapshot: str | None = None
    """Set for segments of snapshot rows (``op = 'r'``) added to a window, e.g. incremental
    snapshot chunks (``'incremental'``): their ``source.snapshot``. None for stream events."""

    def __len__(self) -> int:
        return len(self.op)


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A logical decoding message (``pg_logical_emit_message``), Debezium ``op = m``."""

    transactional: bool
    prefix: str
    content: bytes
    lsn: int
    commit_lsn: int
    """Commit LSN of the enclosing transaction; for non-transactional messages, ``lsn``."""
    xid: int | None
    commit_ts_us: int | None
    total_order: int


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    """A committed transaction that produced at least one event (Debezium BEGIN/END)."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int
    event_count: int
    per_table: tuple[tuple[str, str, int], ...]
    """(schema, table, event count) for each table the transaction touched."""


@dataclass(slots=True)
class Window:
    """Everything decoded from one bounded slot window, committed transactions only."""

    tables: dict[tuple[str, str], list[TableChanges]] = field(default_factory=dict)
    messages: list[LogicalMessage] = field(default_factory=list)
    transactions: list[TransactionInfo] = field(default_factory=list)
    change_count: int = 0
    last_commit_end_lsn: int = 0
    """End LSN of the last commit seen (0 when no transaction committed)."""
    slot_rows: int = 0
    """Rows the slot peek returned (every pgoutput message: BEGIN, COMMIT, RELATION...), which
    is what ``upto_nchanges`` counts; 0 when not read from a peek. Unlike ``segments()``, it
    does not shrink when segments were handed out in portions."""

    def segments(self) -> list[TableChanges]:
        return [seg for segs in self.tables.values() for seg in segs]
