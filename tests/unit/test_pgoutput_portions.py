"""Windows handed out in portions, on message sequences recorded from
PostgreSQL 15: for every scenario and portion size, the portions joined with the final window
equal the window assembled in one piece, column by column, through ``Assembler.feed`` and
through the COPY fast path (``copy_sink``)."""

from __future__ import annotations

import gc
import struct

import pytest

from pgcdc_dagster.cdc.changes import Window
from pgcdc_dagster.cdc.pgoutput.assembler import Assembler
from tests.data.pgoutput.fixtures import Recorded, load, scenario_names
from tests.support.portions import columns, merge_portions

pytestmark = pytest.mark.unit

_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)


def _copy_chunks(recorded: Recorded) -> list[bytes]:
    """The slot rows as COPY BINARY CopyData messages: header, one per row, trailer."""
    rows = [struct.pack(">hiqiIi", 3, 8, lsn, 4, xid, len(data)) + data
            for lsn, xid, data in recorded.rows]
    return [_HEADER + rows[0], *rows[1:], struct.pack(">h", -1)] if rows else []


def _assemble(recorded: Recorded, copy: bool, portion: int | None = None,
              ) -> tuple[Window, list[Window]]:
    portions: list[Window] = []
    kwargs = {} if portion is None else {"portion_changes": portion,
                                         "on_portion": portions.append}
    assembler = Assembler(**kwargs)  # type: ignore[arg-type]
    if copy:
        sink = assembler.copy_sink()
        for chunk in _copy_chunks(recorded):
            sink.write(chunk)
        sink.close()
        assert sink.row_count == len(recorded.rows)
    else:
        for lsn, data in recorded.items():
            assembler.feed(lsn, data)
    assert assembler.portions == len(portions)
    return assembler.finish(), portions


@pytest.mark.parametrize("copy", [False, True], ids=["feed", "copy"])
@pytest.mark.parametrize("name", scenario_names())
def test_portions_join_into_the_whole_window(name: str, copy: bool) -> None:
    recorded = load(name)
    whole, none = _assemble(recorded, copy)
    assert none == []
    rows = sum(len(seg) for seg in whole.segments())
    for portion in (1, 2, 3, 7, 100):
        final, portions = _assemble(recorded, copy, portion)
        assert [sum(len(s) for s in p.segments()) for p in portions] == \
            [portion] * (rows // portion), (name, portion)
        assert all(not p.messages and not p.transactions and not p.change_count
                   for p in portions)
        assert sum(len(seg) for seg in final.segments()) == rows % portion
        assert (final.transactions, final.messages, final.change_count,
                final.last_commit_end_lsn) == (whole.transactions, whole.messages,
                                               whole.change_count, whole.last_commit_end_lsn)
        assert columns(merge_portions(portions, final)) == columns(whole), (name, portion)


def test_portion_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="go together"):
        Assembler(portion_changes=5)
    with pytest.raises(ValueError, match="at least 1"):
        Assembler(portion_changes=0, on_portion=lambda w: None)


@pytest.mark.parametrize("copy", [False, True], ids=["feed", "copy"])
def test_handed_out_segments_are_not_kept(copy: bool) -> None:
    """Memory stays bounded: once handed out, a portion's lists are referenced only by
    its segments (no target, appender or row layout of the assembler keeps them)."""
    recorded = load("multi_table")
    assembler = Assembler(portion_changes=2, on_portion=(portions := []).append)
    if copy:
        sink = assembler.copy_sink()
        for chunk in _copy_chunks(recorded):
            sink.write(chunk)
        sink.close()
    else:
        for lsn, data in recorded.items():
            assembler.feed(lsn, data)
    assembler.finish()
    assert len(portions) >= 2
    gc.collect()
    for portion in portions:
        for seg in portion.segments():
            for name in ("op", "after", "lsn", "total_order"):
                holders = gc.get_referrers(getattr(seg, name))
                assert holders == [seg], (name, holders)
