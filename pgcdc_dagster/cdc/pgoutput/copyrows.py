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

Bulk transactions repeat one row layout (same table, message type, column kinds and value
lengths) over long runs. After an Insert (or Update without old tuple) whose tuple layout
was learnt, the next row first tries that whole-row layout
(:class:`~pgcdc_dagster.cdc.pgoutput.tuples.RowLayout`): one ``struct`` unpack checks every
framing field and length, a second reads the LSN and the values; only ``after`` and ``lsn``
are appended per row, ``op`` and the byte count are settled when the run ends. A row that
does not match exactly takes the path above.

Errors inside ``write`` are kept (the rest of the COPY is drained without work, so the
connection stays usable) and raised by :meth:`CopySink.close`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from itertools import repeat

from pgcdc_dagster.cdc.pgcopy import CopyBinaryParser
from pgcdc_dagster.cdc.pgoutput.errors import message_error
from pgcdc_dagster.cdc.pgoutput.tuples import RowLayout, WireError
from pgcdc_dagster.cdc.pgoutput.writer import WindowWriter
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
        self._spec: RowLayout | None = None
        """Layout of the previous row when the next may take the row-layout path."""
        self._spec_ops: Callable[[Iterable[str]], None] = _no_ops
        self._spec_mark = 0
        """:attr:`rows_written` when the row-layout path was entered."""

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

    def _settle(self) -> None:
        """Leave the row-layout path: give its rows their ``op`` and count their bytes."""
        spec = self._spec
        if spec is not None:
            self._spec = None
            n = self.rows_written - self._spec_mark
            if n:
                self._spec_ops(repeat(spec.op, n))
                self.copy_bytes += n * spec.size
                self.copy_messages += n

    def _portion_now(self) -> None:
        try:
            self.portion_full()
        except Exception as exc:  # kept, re-raised by CopySink.close after the COPY
            self.fail(exc)

    def copy_row(self, chunk: bytes) -> None:
        """Consume one CopyData message (normally exactly one row).

        While the previous row was an Insert (or an Update without old tuple) whose layout
        was learnt, a row of the same layout (:class:`~.tuples.RowLayout`: same table, type,
        kinds and value lengths) costs two ``struct`` unpacks and two appends; its ``op``
        and byte count are settled when the run of such rows ends (:meth:`_settle`).
        """
        spec = self._spec
        if spec is not None and len(chunk) == spec.size and spec.check(chunk) == spec.expect:
            res = spec.unpack(chunk)
            spec.after(spec.values(res))
            spec.lsn(res[0])  # type: ignore[arg-type]
            self.room -= 1
            if not self.room:
                self._portion_now()
            return
        # Any other row. An Insert/Update/Delete is the body of WindowWriter.change, inlined:
        # at a million rows per window a Python call more per row is measurable.
        if spec is not None:
            self._settle()
        size = len(chunk)
        self.copy_bytes += size
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
                        self._open_run(target)
                    learnt = False
                    if kind == _NEW and code != _DELETE:  # Insert, or Update without old row
                        if size - 32 == target.spec_size:
                            res = target.spec_unpack(chunk, 32)
                            if target.spec_meta(res) == target.spec_expect:
                                row, p = target.spec_values(res), size
                                learnt = True
                            else:
                                row, p = target.parse_and_learn(chunk, 32, size)
                                learnt = target.misses == 0
                        else:
                            row, p = target.parse_and_learn(chunk, 32, size)
                            learnt = target.misses == 0
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
                    if not self.room:
                        self.portion_full()
                    elif learnt:
                        # The next row probably has the same layout: try the row-layout path.
                        spec = target.row_layout(code, oid)
                        if spec is not None:
                            self._spec = spec
                            self._spec_ops = target.seg.op.extend
                            self._spec_mark = self.rows_written
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


def _no_ops(ops: Iterable[str]) -> None:
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
