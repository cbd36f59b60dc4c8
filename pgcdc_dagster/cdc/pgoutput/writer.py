"""Write committed changes into a :class:`~pgcdc_dagster.cdc.changes.Window`, one transaction
at a time: the columnar hot path of the assembler.

Insert, Update and Delete messages are parsed in place (no message object, no slicing of
the message out of its COPY row) straight into the lists of the table's current
:class:`~pgcdc_dagster.cdc.changes.TableChanges` segment. Per row only ``op``, ``lsn``
and ``after`` are appended; ``total_order`` is filled per run of consecutive rows of one
table, the columns that are constant within a transaction (commit LSN, xid, commit time,
``collection_order``) in bulk when the transaction ends, and the mostly-default columns
(``before``, ``before_key_only``, ``truncate_options``) are padded lazily. After
:meth:`WindowWriter.end` every list of every segment has the same length.

Portions (bounded memory for huge transactions): with
:meth:`WindowWriter.set_portions`, as soon as ``portion_changes`` rows have been written
since the last portion, the segments written so far are completed (the open run gets its
``total_order``, the open transaction's rows their commit LSN, xid, commit time and
``collection_order``, all known since Begin) and handed to the callback as a
:class:`~pgcdc_dagster.cdc.changes.Window` holding only ``tables``; the writer continues in
fresh segments, and ``total_order`` / ``collection_order`` continue across portions as if
nothing had been cut. Every portion holds exactly ``portion_changes`` rows (the last, left in
:attr:`WindowWriter.window`, fewer); transactions, messages and counts stay in the window.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from itertools import repeat

from pgcdc_dagster.cdc.changes import (
    LogicalMessage,
    Relation,
    Row,
    TableChanges,
    TransactionInfo,
    Window,
)
from pgcdc_dagster.cdc.pgoutput.tuples import (
    MetaParser,
    RowLayout,
    RowParser,
    WireError,
    learn_layout,
    meta_parser,
    row_parser,
)

_u32: Callable[[bytes, int], tuple[int]] = struct.Struct(">I").unpack_from

_INSERT, _UPDATE, _DELETE = 0x49, 0x55, 0x44  # 'I', 'U', 'D'
_NEW, _KEY, _OLD = 0x4E, 0x4B, 0x4F  # 'N', 'K', 'O'


class _Target:
    """The segment that receives a relation's rows, with its list appenders bound."""

    __slots__ = ("after", "gen", "interval", "learned_at", "lsn", "misses", "op", "parse",
                 "parse_shape", "qualified", "seg", "sized", "spec_expect", "spec_meta",
                 "spec_size", "spec_unpack", "spec_values")

    def __init__(self, seg: TableChanges) -> None:
        self.seg = seg
        self.qualified = seg.relation.qualified
        self.parse: RowParser = row_parser(len(seg.relation.columns))
        self.op = seg.op.append
        self.lsn = seg.lsn.append
        self.after = seg.after.append
        self.gen = -1
        # Speculative layout (see tuples.Layout), used by the COPY fast path.
        self.spec_size = -1
        self.spec_unpack: Callable[[bytes, int], tuple[object, ...]] = _no_unpack
        self.spec_meta: Callable[[tuple[object, ...]], object] = _no_meta
        self.spec_expect: object = None
        self.spec_values: Callable[[tuple[object, ...]], Row] = _no_values
        self.misses = 0
        self.interval = 1
        self.learned_at = 0
        # Whole-COPY-row layouts (tuples.RowLayout), used by copyrows.SlotRowWriter.
        self.parse_shape: MetaParser = meta_parser(len(seg.relation.columns))
        self.sized: dict[int, dict[int, RowLayout]] = {}
        """Message type -> row length -> the last row layout seen of that length."""

    def parse_and_learn(self, buf: bytes, pos: int, end: int) -> tuple[Row, int]:
        """Parse a new tuple the slow way; now and then learn its layout for the next rows.

        Learning costs a few microseconds, so it backs off (up to every 4096th miss) while
        learnt layouts keep missing, and comes back to every 16th miss once they hit.
        """
        row, p = self.parse(buf, pos)
        self.misses += 1
        if self.misses >= self.interval and p == end:
            rows = len(self.seg.op) - self.learned_at
            self.interval = 16 if rows >= 2 * self.misses else min(self.interval * 2, 4096)
            layout = learn_layout(buf, pos, end)
            if layout is None:
                self.spec_size = -1
            else:
                self.spec_size = layout.size
                self.spec_unpack = layout.unpack
                self.spec_meta = layout.meta
                self.spec_expect = layout.expect
                self.spec_values = layout.values
            self.misses = 0
            self.learned_at = len(self.seg.op)
        return row, p

    def park(self) -> None:
        """Let go of the segment (handed out in a portion) until :meth:`rebind`."""
        self.rebind(TableChanges(self.seg.relation))

    def rebind(self, seg: TableChanges) -> None:
        """Write into ``seg`` from now on (after a portion), keeping the learnt layout."""
        self.seg = seg
        self.op = seg.op.append
        self.lsn = seg.lsn.append
        self.after = seg.after.append
        self.gen = -1
        self.learned_at = 0


def _no_unpack(buf: bytes, pos: int) -> tuple[object, ...]:
    raise AssertionError("no layout learnt")  # unreachable: spec_size is -1


def _no_meta(res: tuple[object, ...]) -> object:
    raise AssertionError("no layout learnt")


def _no_values(res: tuple[object, ...]) -> Row:
    raise AssertionError("no layout learnt")


_SHARED_ORDINALS: list[int] = []
_SHARED_LIMIT = 1 << 17
"""Ordinals below this are shared int objects (~5 MiB at most), not one new int per row."""


def _ordinals(start: int, stop: int) -> list[int] | range:
    """``range(start, stop)``, as shared int objects when they are small."""
    if stop > _SHARED_LIMIT or stop - start < 64:
        return range(start, stop)
    if stop > len(_SHARED_ORDINALS):
        size = min(max(stop, 2 * len(_SHARED_ORDINALS)), _SHARED_LIMIT)
        _SHARED_ORDINALS.extend(range(len(_SHARED_ORDINALS), size))
    return _SHARED_ORDINALS[start:stop]


def _pad(values: list[object], size: int, fill: object) -> None:
    if len(values) < size:
        values.extend(repeat(fill, size - len(values)))


class WindowWriter:
    """Accumulates the committed transactions of one window into a :class:`Window`."""

    def __init__(self) -> None:
        self.window = Window()
        self.relations: dict[int, Relation] = {}
        """Relation oid -> latest Relation message applied to the committed stream."""
        self._targets: dict[int, _Target] = {}
        self._gen = 0
        self._touched: list[tuple[TableChanges, int]] = []
        self._touched_ids: set[int] = set()
        self._last: _Target | None = None
        """Target of the open run: consecutive rows of one segment whose total_order is
        filled when the run closes (a message, another table, or the commit)."""
        self._run_start = 0
        self.in_txn = False
        self.skip = False
        self.order = 0
        """Events of the open transaction, not counting the open run."""
        self.xid = 0
        self.commit_lsn = 0
        self.commit_ts_us = 0
        self.room = -1
        """Rows still to write before the next portion; negative (never reaching 0) when
        portions are off. Every row written decrements it."""
        self._room_base = -1
        """``_room_base - room`` = rows written so far."""
        self._portion_changes = 0
        self._on_portion: Callable[[Window], None] | None = None
        self._done: dict[tuple[str, str], int] = {}
        """Events per table of the open transaction already handed out in portions."""
        self._parked: dict[int, _Target] = {}
        """Targets whose segments went out in a portion, reused (with their learnt layouts)
        when their relation writes again."""
        self.portions = 0
        """Portions handed out so far."""

    def set_portions(self, portion_changes: int, on_portion: Callable[[Window], None]) -> None:
        """Hand out the window in portions of ``portion_changes`` rows (see module doc)."""
        if portion_changes < 1:
            raise ValueError(f"portion_changes must be at least 1, got {portion_changes}")
        self._portion_changes = portion_changes
        self._on_portion = on_portion
        self._room_base += portion_changes - self.room
        self.room = portion_changes

    @property
    def rows_written(self) -> int:
        """Rows written into the window so far (including those handed out)."""
        return self._room_base - self.room

    def _settle(self) -> None:
        """Bring every list up to date (subclasses may defer per-row work)."""

    def portion_full(self) -> None:
        """Called when :attr:`room` reaches 0: complete and hand out the rows so far."""
        self._settle()
        self.room = self._portion_changes
        self._room_base += self._portion_changes
        if self._last is not None:
            self._close_run()
        if self.in_txn:
            done = self._done
            for seg, start in self._touched:
                qualified = seg.relation.qualified
                n = done.get(qualified, 0)
                done[qualified] = n + self._fill(seg, start, n)
            self._touched.clear()
            self._touched_ids.clear()
        window = self.window
        tables = {key: kept for key, segs in window.tables.items()
                  if (kept := [seg for seg in segs if len(seg)])}
        window.tables = {}
        for target in self._targets.values():
            target.park()
        self._parked.update(self._targets)
        self._targets.clear()
        self.portions += 1
        assert self._on_portion is not None
        self._on_portion(Window(tables=tables))

    def relation(self, relation: Relation) -> None:
        """Apply a Relation message; a changed shape opens a new segment at the next row."""
        if self.relations.get(relation.oid) != relation:
            self.relations[relation.oid] = relation
            self._targets.pop(relation.oid, None)
            self._parked.pop(relation.oid, None)

    def begin(self, xid: int, commit_lsn: int, commit_ts_us: int, skip: bool) -> None:
        """Open a transaction whose commit LSN and time are already known."""
        self._gen += 1
        self._touched.clear()
        self._touched_ids.clear()
        self._last = None
        self.in_txn = True
        self.skip = skip
        self.order = 0
        self.xid = xid
        self.commit_lsn = commit_lsn
        self.commit_ts_us = commit_ts_us
        self._done = {}

    def _target(self, oid: int, at: int) -> _Target:
        relation = self.relations.get(oid)
        if relation is None:
            raise WireError(f"change for relation oid {oid} that no Relation message described",
                            at)
        segments = self.window.tables.setdefault(relation.qualified, [])
        if not segments or segments[-1].relation != relation:
            segments.append(TableChanges(relation))
        parked = self._parked.pop(oid, None)
        if parked is not None:
            parked.rebind(segments[-1])
            self._targets[oid] = parked
            return parked
        target = self._targets[oid] = _Target(segments[-1])
        return target

    def _open_run(self, target: _Target) -> None:
        """Rows start going to ``target``: close the previous run, note the first touch."""
        if self._last is not None:
            self._close_run()
        if target.gen != self._gen:
            target.gen = self._gen
            seg = target.seg
            if id(seg) not in self._touched_ids:
                self._touched_ids.add(id(seg))
                self._touched.append((seg, len(seg.op)))
        self._last = target
        self._run_start = len(target.seg.op)

    def _close_run(self) -> None:
        """Give the rows of the open run their ``total_order``."""
        last = self._last
        if last is None:
            return
        seg = last.seg
        order = self.order
        new = len(seg.op) - self._run_start
        seg.total_order += _ordinals(order + 1, order + new + 1)
        self.order = order + new
        self._last = None

    def change(self, code: int, lsn: int, buf: bytes, p: int, end: int) -> None:
        """Write one Insert/Update/Delete; ``p`` points at its relation oid.

        Raises:
            WireError: unknown relation, bad tuple marker, or the message does not end at
                ``end``; ``IndexError`` / ``struct.error`` on a truncated buffer.
        """
        if self.skip:
            return
        target = self._targets.get(_u32(buf, p)[0])
        if target is None:
            target = self._target(_u32(buf, p)[0], p)
        if target is not self._last:
            self._open_run(target)
        p += 4
        kind = buf[p]
        if kind == _NEW and code != _DELETE:  # Insert, or Update without an old row
            p += 1
            if end - p == target.spec_size:
                res = target.spec_unpack(buf, p)
                if target.spec_meta(res) == target.spec_expect:
                    row, p = target.spec_values(res), end
                else:
                    row, p = target.parse_and_learn(buf, p, end)
            else:
                row, p = target.parse_and_learn(buf, p, end)
            target.op("c" if code == _INSERT else "u")
            target.after(row)
        elif code == _INSERT:
            raise WireError(f"expected 'N' before the new tuple, found {kind:#04x}", p)
        elif code == _UPDATE:
            if kind != _KEY and kind != _OLD:
                raise WireError(f"expected 'K', 'O' or 'N', found {kind:#04x}", p)
            old, p = target.parse(buf, p + 1)
            if buf[p] != _NEW:
                raise WireError(f"expected 'N' after the old tuple, found {buf[p]:#04x}", p)
            row, p = target.parse(buf, p + 1)
            self._before(target.seg, old, kind == _KEY)
            target.op("u")
            target.after(row)
        else:
            if kind != _KEY and kind != _OLD:
                raise WireError(f"expected 'K' or 'O', found {kind:#04x}", p)
            old, p = target.parse(buf, p + 1)
            self._before(target.seg, old, kind == _KEY)
            target.op("d")
            target.after(None)
        if p != end:
            raise WireError(f"message ends at byte {end}, its tuples at byte {p}", min(p, end))
        target.lsn(lsn)
        self.room -= 1
        if not self.room:
            self.portion_full()

    def decoded_change(self, code: int, lsn: int, oid: int, before: Row | None,
                       key_only: bool, after: Row | None) -> None:
        """Write one change that another plugin's reader already decoded into rows (what
        :meth:`change` parses out of an Insert/Update/Delete): ``code`` ``'I'``/``'U'``/
        ``'D'`` as a byte value, ``before`` the old tuple pgoutput would send (None: none;
        ``key_only`` for a ``'K'`` one), ``after`` the new tuple (None for a delete).

        Raises:
            WireError: no Relation describes ``oid``.
        """
        if self.skip:
            return
        target = self._targets.get(oid)
        if target is None:
            target = self._target(oid, 0)
        if target is not self._last:
            self._open_run(target)
        if before is not None:
            self._before(target.seg, before, key_only)
        target.op("c" if code == _INSERT else "u" if code == _UPDATE else "d")
        target.after(after)
        target.lsn(lsn)
        self.room -= 1
        if not self.room:
            self.portion_full()

    @staticmethod
    def _before(seg: TableChanges, old: Row, key_only: bool) -> None:
        size = len(seg.op)
        _pad(seg.before, size, None)  # type: ignore[arg-type]
        _pad(seg.before_key_only, size, False)  # type: ignore[arg-type]
        seg.before.append(old)
        seg.before_key_only.append(key_only)

    def truncate(self, lsn: int, oids: tuple[int, ...], options: int) -> None:
        """Write one 't' row per truncated relation."""
        if self.skip:
            return
        for oid in oids:
            target = self._targets.get(oid) or self._target(oid, 0)
            self._open_run(target)
            seg = target.seg
            _pad(seg.truncate_options, len(seg.op), 0)  # type: ignore[arg-type]
            seg.truncate_options.append(options)
            target.op("t")
            target.after(None)
            target.lsn(lsn)
            self.room -= 1
            if not self.room:
                self.portion_full()
        self._close_run()

    def message(self, lsn: int, prefix: str, content: bytes) -> None:
        """Record a transactional logical message of the open transaction."""
        if self.skip:
            return
        self._close_run()
        self.order += 1
        self.window.messages.append(LogicalMessage(
            True, prefix, content, lsn, self.commit_lsn, self.xid, self.commit_ts_us,
            self.order))

    def end(self, end_lsn: int) -> TransactionInfo | None:
        """Close the transaction: fill per-transaction columns, record TransactionInfo."""
        window = self.window
        window.last_commit_end_lsn = end_lsn
        self.in_txn = False
        if self._last is not None:
            self._close_run()
        if self.skip or self.order == 0:
            return None
        counts = self._done
        self._done = {}
        for seg, start in self._touched:
            qualified = seg.relation.qualified
            done = counts.get(qualified, 0)
            counts[qualified] = done + self._fill(seg, start, done)
        self._touched.clear()
        self._touched_ids.clear()
        info = TransactionInfo(
            self.xid, self.commit_lsn, end_lsn, self.commit_ts_us, self.order,
            tuple([(schema, table, n) for (schema, table), n in counts.items()]))
        window.transactions.append(info)
        window.change_count += self.order
        return info

    def _fill(self, seg: TableChanges, start: int, done: int) -> int:
        """Give the segment's rows of this transaction their per-transaction columns."""
        size = len(seg.op)
        new = size - start
        if new == 1:  # small transactions: appends beat extend(repeat(...))
            seg.commit_lsn.append(self.commit_lsn)
            seg.xid.append(self.xid)
            seg.commit_ts_us.append(self.commit_ts_us)
            seg.collection_order.append(done + 1)
            # The sparse lists were full before this transaction: at most one is missing.
            if len(seg.before) != size:
                seg.before.append(None)
            if len(seg.before_key_only) != size:
                seg.before_key_only.append(False)
            if len(seg.truncate_options) != size:
                seg.truncate_options.append(0)
            return 1
        seg.commit_lsn.extend(repeat(self.commit_lsn, new))
        seg.xid.extend(repeat(self.xid, new))
        seg.commit_ts_us.extend(repeat(self.commit_ts_us, new))
        total = seg.total_order
        if new and total[start] == done + 1 and total[-1] == done + new:
            # Only this table so far (total_order ascends): the same numbers, no new ints.
            seg.collection_order += total[start:]
        else:
            seg.collection_order += _ordinals(done + 1, done + new + 1)
        if len(seg.before) != size:
            _pad(seg.before, size, None)  # type: ignore[arg-type]
        if len(seg.before_key_only) != size:
            _pad(seg.before_key_only, size, False)  # type: ignore[arg-type]
        if len(seg.truncate_options) != size:
            _pad(seg.truncate_options, size, 0)  # type: ignore[arg-type]
        return new

    def nontransactional_message(self, lsn: int, prefix: str, content: bytes) -> None:
        """Record a message emitted with ``transactional => false`` (never rolled back)."""
        self.window.messages.append(
            LogicalMessage(False, prefix, content, lsn, lsn, None, None, 0))
        self.window.change_count += 1
