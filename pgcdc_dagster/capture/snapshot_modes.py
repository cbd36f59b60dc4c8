"""``snapshot.mode``: whether to snapshot, which tables, and where the snapshot's point comes from.

Debezium decides per connector with its offsets; here the "offset" of a table is its bronze
app transaction (``committed_version(bronze, <prefix>:bronze:<table>)``), the slot is the
replication slot, and an *open* snapshot is one the progress table shows as started but
neither finished nor abandoned. The snapshot step runs before every stream step, so a table
never streams before its snapshot is committed.

================ ===========================================================================
mode             when a snapshot is taken (``force`` = the snapshot step was asked for, e.g.
                 by the initial_snapshot job: the Dagster equivalent of a connector start)
================ ===========================================================================
``initial``      for tables without an offset. No slot and no offset at all: the slot is
                 created with an exported snapshot and every table is read at its consistent
                 point. A missing or lost slot while offsets exist fails (the WAL since the
                 offsets is gone): use ``when_needed``.
``initial_only`` as ``initial``, from a temporary slot (nothing pins WAL afterwards), and
                 nothing is streamed; an interrupted one is read again whole (without a
                 stream, chunks read at two points cannot be reconciled).
``no_data``      never (alias ``never``); a missing slot is created and streaming starts at
                 its creation point; tables without an offset get an empty one there. A
                 missing or lost slot while offsets exist fails, as for ``initial``.
``when_needed``  as ``initial``, and also when the slot is missing, lost or invalidated
                 (``wal_status = lost`` / ``confirmed_flush_lsn`` NULL): then the slot is
                 recreated and every table is snapshotted again (silver replaced).
``always``       with ``force``: every table, every time; otherwise as ``when_needed``.
================ ===========================================================================

Where does the consistent point come from?

* ``create`` / ``recreate``: a new slot ``CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT``
  (recreate drops the lost slot first). Streaming starts at the slot's consistent point.
* ``temporary``: the slot exists and is healthy, but tables need a snapshot (new tables,
  ``always``, a table whose offset is gone, or an interrupted snapshot). A *temporary* slot
  is created with an exported snapshot at point ``P``; the chunks are read in that snapshot
  and their rows carry ``P`` as their sequence, and the table's offset becomes ``P``, so the
  existing slot's stream applies exactly the table's changes committed at or after ``P``.
  This is exact: the exported snapshot shows precisely the transactions whose commit record
  precedes ``P`` (PostgreSQL's own logical-replication table sync relies on the same
  property), and the existing slot, being confirmed at or before the current WAL position,
  still delivers every change after ``P``. It needs no locks and no watermarks.
* Resuming an open snapshot: the exported snapshot died with its connection, so the chunks
  not yet read are read at a new temporary point ``P2``. Key-range chunks make this exact:
  every key belongs to one range; rows of ranges read at ``P`` carry ``P``, rows of ranges
  read at ``P2`` carry ``P2``; the table's offset is the smallest point, so the stream
  delivers every change after it, and silver keeps, per key, the greatest sequence (a change
  older than the range's point loses to the snapshot row; a newer one wins; a delete leaves a
  tombstone; a TRUNCATE removes only rows older than itself). CTID chunks are not stable
  under updates (a row can move to a range read at another point and be read twice or never),
  so a CTID-chunked table is re-read whole when its snapshot is resumed. Chunks read at a
  point the slot has already been advanced past cannot be completed by the stream and are
  read again. The watermark (DBLog) procedure of incremental snapshots is not needed for these
  cases; it remains the way to snapshot while the stream keeps running.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from pgcdc_dagster.capture.settings import SNAPSHOT_MODES
from pgcdc_dagster.capture.snapshot_state import ChunkDone, SnapshotState, TableName, TablePlan
from pgcdc_dagster.exceptions import ConfigurationError, SlotLostError
from pgcdc_dagster.postgres.slot import SlotInfo


def normalise_mode(mode: str) -> str:
    """The mode with Debezium's alias resolved (``never`` = ``no_data``)."""
    if mode not in SNAPSHOT_MODES:
        raise ConfigurationError(
            f"snapshot.mode = {mode!r} is not supported; use one of {', '.join(SNAPSHOT_MODES)}")
    return "no_data" if mode == "never" else mode


def slot_usable(slot: SlotInfo | None) -> bool:
    """The slot exists and still has its WAL (not lost or invalidated)."""
    return slot is not None and slot.usable


@dataclass(frozen=True)
class SnapshotDecision:
    """What the snapshot step will do."""

    slot_action: str
    """``none`` | ``create`` | ``recreate`` | ``temporary`` | ``create_plain`` (no_data)."""
    tables: tuple[TableName, ...] = ()
    """Tables to read (in order)."""
    empty_tables: tuple[TableName, ...] = ()
    """Tables that get an offset without data (``no_data``, or excluded by
    ``snapshot.include.collection.list``)."""
    resume: SnapshotState | None = None
    """The open snapshot this run finishes."""
    abandon: SnapshotState | None = None
    """An open snapshot that can no longer be finished (its slot is gone)."""
    reason: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def performed(self) -> bool:
        return bool(self.tables or self.empty_tables or self.resume is not None)


def decide(mode: str, *, force: bool, slot: SlotInfo | None, slot_name: str,
           tables: Sequence[TableName], offsets: Mapping[TableName, bool],
           open_snapshot: SnapshotState | None,
           snapshot_include: Collection[TableName] | None = None) -> SnapshotDecision:
    """Apply ``snapshot.mode`` to the current slot, offsets and progress.

    Args:
        mode: ``snapshot.mode`` (``never`` accepted).
        force: the snapshot step was asked for (``always`` re-snapshots only then).
        slot: the slot's state, None when missing.
        tables: the captured tables, in order.
        offsets: per table, whether bronze holds its offset (a committed snapshot or stream).
        open_snapshot: the latest snapshot when it is neither finished nor abandoned.
        snapshot_include: ``snapshot.include.collection.list`` matches (None = every table).

    Raises:
        SlotLostError: ``initial``/``no_data`` with a missing or lost slot while offsets exist.
    """
    mode = normalise_mode(mode)
    usable = slot_usable(slot)
    missing = [t for t in tables if not offsets.get(t, False)]
    any_offset = len(missing) < len(tables)

    def split(chosen: Sequence[TableName]) -> tuple[tuple[TableName, ...], tuple[TableName, ...]]:
        if snapshot_include is None:
            return tuple(chosen), ()
        read = tuple(t for t in chosen if t in snapshot_include)
        empty = tuple(t for t in chosen if t not in snapshot_include and t in missing)
        return read, empty

    if mode == "no_data":
        if slot is None:
            if any_offset:
                raise _lost(slot_name, "does not exist", mode)
            return SnapshotDecision("create_plain", empty_tables=tuple(tables),
                                    reason="snapshot.mode = no_data: slot created, no snapshot")
        if not usable:
            raise _lost(slot_name, "is invalidated (wal_status lost)", mode)
        return SnapshotDecision("none", empty_tables=tuple(missing),
                                reason="snapshot.mode = no_data: no snapshot")

    abandon: SnapshotState | None = None
    resume = open_snapshot
    if mode != "initial_only" and not usable and open_snapshot is not None:
        abandon, resume = open_snapshot, None  # its stream position is gone with the slot

    if mode == "initial_only":
        chosen = list(tables) if force and not any_offset else missing
        read, empty = split(chosen)
        if resume is None and not read and not empty:
            return SnapshotDecision("none", reason="snapshot.mode = initial_only: every table "
                                    "has its snapshot; nothing to do")
        return SnapshotDecision("temporary", read, empty, resume, None,
                                "snapshot.mode = initial_only")

    if not usable:
        state = "does not exist" if slot is None else "is invalidated (wal_status lost)"
        if mode == "initial" and any_offset:
            raise _lost(slot_name, state, mode)
        read, empty = split(tables)
        action = "create" if slot is None else "recreate"
        return SnapshotDecision(action, read, empty, None, abandon,
                                f"slot {slot_name!r} {state}: snapshot of every table")

    if mode == "always" and force:
        read, empty = split(tables)
        return SnapshotDecision("temporary", read, empty, resume, None,
                                "snapshot.mode = always: every table again")
    read, empty = split(missing)
    if resume is None and not read and not empty:
        return SnapshotDecision("none", reason=f"slot {slot_name!r} exists and every table "
                                "has its snapshot; nothing to do")
    why = "resuming the interrupted snapshot" if resume is not None else \
        f"tables without a snapshot: {', '.join('.'.join(t) for t in read + empty)}"
    return SnapshotDecision("temporary", read, empty, resume, None, why)


def reusable_chunks(plan: TablePlan, chunks: Mapping[int, ChunkDone],
                    stream_from: int) -> dict[int, ChunkDone]:
    """The chunks of an interrupted snapshot that the resumed one keeps.

    A key range read at point ``P`` stays valid while the stream still delivers every change
    after ``P`` (``P >= stream_from``); CTID ranges are only consistent with each other when
    all of them were read at one point, so a CTID table is kept whole or not at all.
    """
    if plan.kind == "ctid":
        points = {c.lsn for c in chunks.values()}
        whole = len(chunks) == len(plan.chunks) and len(points) == 1
        return dict(chunks) if whole and min(points) >= stream_from else {}
    return {i: c for i, c in chunks.items() if c.lsn >= stream_from}


def missed_windows(log: Sequence[tuple[int, Collection[TableName], object]], table: TableName,
                   offset: int, confirmed: int) -> bool:
    """True when windows after the table's offset were read without the table.

    ``log`` holds the capture set as each run's windows began, ``(slot position, tables)``
    in position order (recorded when it changed); a set is in force from its position to the
    next one's, the last to ``confirmed`` (the slot's position now). A table left out of a
    set in force past its offset lost the changes of those windows: its old offset cannot be
    reused (it needs a new snapshot, which replaces silver).
    """
    ordered = sorted(log, key=lambda r: r[0])
    for i, (position, tables, _) in enumerate(ordered):
        until = ordered[i + 1][0] if i + 1 < len(ordered) else confirmed
        if table not in tables and until > max(offset, position):
            return True
    return False


def _lost(slot: str, state: str, mode: str) -> SlotLostError:
    return SlotLostError(
        f"replication slot {slot!r} {state}, but bronze holds offsets of an earlier capture: "
        f"the changes since then are gone with the slot, and snapshot.mode = {mode} does not "
        "re-snapshot. Set snapshot.mode = when_needed (or always) to take a new snapshot that "
        "replaces silver.")
