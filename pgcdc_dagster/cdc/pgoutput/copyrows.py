"""Feed the COPY BINARY rows of a slot peek straight into the window: the hottest path.

``COPY (SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes(...)) TO STDOUT
(FORMAT binary)`` arrives as one CopyData message per row, and psycopg2's ``copy_expert``
calls ``file.write(chunk)`` for each. :class:`CopySink`'s ``write`` is bound directly to
:meth:`SlotRowWriter.copy_row`, so a row costs one Python call: one ``struct`` unpack reads
the COPY framing (Int16 3, Int32 8, Int64 lsn, Int32 4, UInt32 xid, Int32 length), the
message type, the relation oid and the tuple marker, then an Insert/Update/Delete of an
open transaction is parsed in place into its segment. Everything else (header, trailer,
other messages, rows split across writes) takes the general path through
:class:`~pgcdc_dagster.cdc.pgcopy.CopyBinaryParser` and ``Assembler.feed``.

Rows of a bulk transaction mostly repeat a few layouts (same table, message type, column
kinds and value lengths). Every Insert, or Update without old tuple, parsed by the code above
records its layout (:class:`~pgcdc_dagster.cdc.pgoutput.tuples.RowLayout`) as the last one
seen for its row length, per table and message type, and enters the row-layout path for that
table and type: a following row whose length has a layout is checked against it with one
``struct`` unpack (every framing field, the relation oid, every kind byte and length) and,
if it matches exactly, its LSN and values are read with a second one; only ``after`` and
``lsn`` are appended per row, ``op`` and the message count are settled when the path is left
or interrupted. Any other row takes the code above. On a bulk load whose value lengths vary
from row to row (``bench/bench_slot_read.py --varied``) about four rows in five still match
the layout last seen for their length.

Errors inside ``write`` are kept (the rest of the COPY is drained without work, so the
connection stays usable) and raised by :meth:`CopySink.close`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from itertools import repeat

from pgcdc_dagster.cdc.changes import Row
from pgcdc_dagster.cdc.pgcopy import CopyBinaryParser
from pgcdc_dagster.cdc.pgoutput.errors import message_error
from pgcdc_dagster.cdc.pgoutput.tuples import RowLayout, WireError, row_layout
from pgcdc_dagster.cdc.pgoutput.writer import WindowWriter, _Target
from pgcdc_dagster.exceptions import DecodeError

_ROW = struct.Struct(">hiqiIiBIB")  # COPY framing + message type, relation oid, tuple marker
_FRAMING = struct.Struct(">hiqiIi")  # field count, 8, lsn, 4, xid, data length
_FRAME = 26  # bytes of COPY framing before the pgoutput message
_LSN = struct.Struct(">q")
_INSERT, _UPDATE, _DELETE = 0x49, 0x55, 0x44
_NEW, _KEY, _OLD = 0x4E, 0x4B, 0x4F

Feed = Callable[[int, bytes, int, int], None]


class SlotRowWriter(WindowWriter):
    """A :class:`WindowWriter` that also takes whole COPY rows of a slot peek."""

    def __init__(self) -> None:
        super().__init__()
        self.direct = False
        """Rows of an open, not skipped Begin/Commit transaction may be written in place."""
        self.copy_ready = False
        """The COPY header is read and no partial row is pending."""
        self.error: BaseException | None = None
        self.fast = False
        """``direct and copy_ready and error is None``: one flag to test per row."""
        self.copy_bytes = 0
        self.copy_messages = 0
        """CopyData messages received (one per slot row, plus header and trailer)."""
        self.feed: Feed | None = None
        """``Assembler.feed``: every message the fast path does not handle."""
        self.copy_fallback: Callable[[bytes], None] | None = None
        # The row-layout path: while active, rows of one table and message type ('I', or
        # 'U' without old tuple) whose length has a layout (``_layout_of``) are checked and
        # unpacked in two struct calls; their ``op`` and count are settled later.
        self._layout_of: Callable[[int], RowLayout | None] = _NO_LAYOUTS.get
        self._active: _Target | None = None
        self._active_code = 0
        self._after: Callable[[Row | None], None] = _unbound
        self._lsn: Callable[[int], None] = _unbound
        self._ops: Callable[[Iterable[str]], None] = _unbound
        self._op = "c"
        self._mark = 0
        """:attr:`rows_written` after the last row that did not take the path."""

    def set_direct(self, direct: bool) -> None:
        """The assembler entered (True) or left (False) an ordinary transaction."""
        if not direct:
            self._settle()
        self.direct = direct
        self.fast = direct and self.copy_ready and self.error is None

    def set_copy_ready(self, ready: bool) -> None:
        """The COPY parser is (or is not) at a row boundary."""
        if not ready:
            self._settle()
        self.copy_ready = ready
        self.fast = ready and self.direct and self.error is None

    def fail(self, exc: BaseException) -> None:
        """Keep the first error; the rest of the COPY is drained without work."""
        self._settle()
        if self.error is None:
            self.error = exc
        self.fast = False

    def _account(self) -> None:
        """Give the rows written by the row-layout path since :attr:`_mark` their ``op``."""
        written = self.rows_written
        n = written - self._mark
        if n:
            self._ops(repeat(self._op, n))
            self.copy_messages += n
            self._mark = written

    def _settle(self) -> None:
        """Leave the row-layout path (settling its rows)."""
        if self._active is not None:
            self._account()
            self._active = None
            self._layout_of = _NO_LAYOUTS.get
            self._after = self._lsn = self._ops = _unbound

    def _activate(self, target: _Target, code: int, oid: int, size: int,
                  shape: tuple[int, ...] | None) -> None:
        """After an Insert / Update without old tuple of ``size`` bytes, written by the
        general code: learn its layout (``shape``, if parsed) and enter the row-layout path
        for ``target`` and ``code``."""
        layouts = target.sized.get(code)
        if layouts is None:
            layouts = target.sized[code] = {}
        if shape is not None:
            known = layouts.get(size)
            if known is None or known.shape != shape:
                if len(layouts) >= _MAX_LAYOUTS:
                    layouts.clear()
                layouts[size] = row_layout(code, oid, shape)
        if self._active is not target or self._active_code != code:
            self._settle()
            self._active = target
            self._active_code = code
            self._layout_of = layouts.get
            self._after = target.after
            self._lsn = target.lsn
            self._ops = target.seg.op.extend
            self._op = "c" if code == _INSERT else "u"

    def _portion_now(self) -> None:
        try:
            self.portion_full()
        except Exception as exc:  # kept, re-raised by CopySink.close after the COPY
            self.fail(exc)

    def copy_row(self, chunk: bytes) -> None:
        """Consume one CopyData message (normally exactly one row).

        On the row-layout path (see the module doc), a row whose length has a layout of
        the current table and message type, and whose framing, kinds and lengths match it
        exactly, costs two ``struct`` unpacks and two appends.
        """
        size = len(chunk)
        self.copy_bytes += size
        spec = self._layout_of(size)
        if spec is not None and spec.check(chunk) == spec.expect:
            res = spec.unpack(chunk)
            self._after(spec.values(res))
            self._lsn(res[0])  # type: ignore[arg-type]
            self.room -= 1
            if not self.room:
                self._portion_now()
            return
        # Any other row. An Insert/Update/Delete is the body of WindowWriter.change, inlined:
        # at a million rows per window a Python call more per row is measurable.
        if self._active is not None:
            self._account()
        self.copy_messages += 1
        if self.fast and size > 31:
            try:
                nfields, len_lsn, lsn, len_xid, _, len_data, code, oid, kind = _ROW.unpack_from(
                    chunk, 0)
                if (code == _INSERT or code == _UPDATE or code == _DELETE) \
                        and len_data + _FRAME == size and nfields == 3 and len_lsn == 8 \
                        and len_xid == 4:
                    target = self._targets.get(oid)
                    if target is None:
                        target = self._target(oid, _FRAME + 1)
                    if target is not self._last:
                        if self._active is not None:
                            self._settle()
                        self._open_run(target)
                    shape: tuple[int, ...] | None = None
                    if kind == _NEW and code != _DELETE:  # Insert, or Update without old row
                        row, p, shape = target.parse_shape(chunk, 32)
                        target.op("c" if code == _INSERT else "u")
                        target.after(row)
                    elif code == _INSERT:
                        raise WireError(f"expected 'N' before the new tuple, found {kind:#04x}",
                                        31)
                    elif code == _UPDATE:
                        if kind == _KEY or kind == _OLD:
                            old, p = target.parse(chunk, 32)
                            if chunk[p] != _NEW:
                                raise WireError(f"expected 'N' after the old tuple, found "
                                                f"{chunk[p]:#04x}", p)
                            row, p = target.parse(chunk, p + 1)
                            self._before(target.seg, old, kind == _KEY)
                        else:
                            raise WireError(f"expected 'K', 'O' or 'N', found {kind:#04x}", 31)
                        target.op("u")
                        target.after(row)
                    else:
                        if kind != _KEY and kind != _OLD:
                            raise WireError(f"expected 'K' or 'O', found {kind:#04x}", 31)
                        old, p = target.parse(chunk, 32)
                        self._before(target.seg, old, kind == _KEY)
                        target.op("d")
                        target.after(None)
                    if p != size:
                        raise WireError(f"message ends at byte {size}, its tuples at byte {p}",
                                        min(p, size))
                    target.lsn(lsn)
                    self.room -= 1
                    self._mark = self.rows_written  # this row has its op already
                    if not self.room:
                        self.portion_full()  # leaves the row-layout path
                    elif shape is not None:
                        self._activate(target, code, oid, size, shape)
                    return
            except (WireError, IndexError, struct.error) as exc:
                self.fail(_change_error(chunk, exc))
                return
            except Exception as exc:  # kept, re-raised by CopySink.close after the COPY
                self.fail(exc)
                return
        self._copy_other(chunk, size)

    def _copy_other(self, chunk: bytes, size: int) -> None:
        """Any other row: Begin, Commit, Relation..., or the COPY header and trailer."""
        self._settle()
        if self.error is not None:
            return
        try:
            if self.copy_ready and size >= _FRAME + 1:
                nfields, len_lsn, lsn, len_xid, _, len_data = _FRAMING.unpack_from(chunk, 0)
                if len_data + _FRAME == size and nfields == 3 and len_lsn == 8 \
                        and len_xid == 4:
                    self.feed(lsn, chunk, _FRAME, size)  # type: ignore[misc]
                    return
            self.copy_fallback(chunk)  # type: ignore[misc]
        except Exception as exc:  # kept, re-raised by CopySink.close after the COPY
            self.fail(exc)


_MAX_LAYOUTS = 1024
"""Row lengths remembered per table and message type."""
_NO_LAYOUTS: dict[int, RowLayout] = {}
"""Off the row-layout path (never written to)."""


def _unbound(value: object) -> None:
    raise AssertionError("row-layout path not entered")


def _change_error(chunk: bytes, exc: Exception) -> DecodeError:
    """Name the message type, offset and LSN of a failed in-place change."""
    if isinstance(exc, WireError):
        what, offset = exc.what, exc.offset - _FRAME
    else:
        what, offset = f"truncated ({exc})", len(chunk) - _FRAME
    lsn = _LSN.unpack_from(chunk, 6)[0]
    return message_error(chunk[_FRAME], what, offset, lsn)


class CopySink:
    """The ``file`` argument of ``cursor.copy_expert`` for a slot peek."""

    def __init__(self, writer: SlotRowWriter, feed: Feed) -> None:
        self._writer = writer
        self._parser = CopyBinaryParser()
        self._feed = feed
        self._parsed_messages = 0
        self._parsed_rows = 0
        writer.feed = feed
        writer.copy_fallback = self._general
        self.write = writer.copy_row

    @property
    def byte_count(self) -> int:
        """COPY bytes received."""
        return self._writer.copy_bytes

    @property
    def row_count(self) -> int:
        """Slot rows received so far (what ``upto_nchanges`` counts)."""
        return self._writer.copy_messages - self._parsed_messages + self._parsed_rows

    def _general(self, chunk: bytes) -> None:
        """Header, trailer, short messages or rows split across writes."""
        self._parsed_messages += 1
        for row in self._parser.feed(chunk):
            self._parsed_rows += 1
            if len(row) != 3 or row[0] is None or row[2] is None or len(row[0]) != 8:
                raise DecodeError(f"slot COPY row has an unexpected shape: {row!r:.200}")
            data = row[2]
            self._feed(_LSN.unpack(row[0])[0], data, 0, len(data))
        self._writer.set_copy_ready(self._parser.at_boundary)

    def close(self) -> None:
        """Raise the first error seen during the COPY, or a missing trailer.

        Raises:
            DecodeError: the rows could not be decoded or the stream was incomplete.
        """
        self._writer._settle()
        if self._writer.error is not None:
            raise self._writer.error
        self._parser.close()
