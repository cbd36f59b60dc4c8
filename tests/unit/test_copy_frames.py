"""Rows found in a raw COPY OUT protocol stream, whatever the buffer boundaries and whatever
the values look like (values that imitate a row message's header included)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pgcdc_dagster.cdc import copy_columns as cc
from pgcdc_dagster.cdc.copy_frames import CopyOutFramer
from pgcdc_dagster.cdc.pgcopy import SIGNATURE
from pgcdc_dagster.exceptions import DecodeError

NCOLS = 2


def _msg(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack(">i", len(body) + 4) + body


def _tuple(*fields: bytes | None) -> bytes:
    out = struct.pack(">h", len(fields))
    for f in fields:
        out += struct.pack(">i", -1) if f is None else struct.pack(">i", len(f)) + f
    return out


def _reply(rows: list[bytes], *, extra: dict[int, bytes] | None = None,
           end: bytes = b"") -> bytes:
    """A COPY OUT reply: CopyOutResponse, the header with the first row, rows, trailer,
    CopyDone, CommandComplete, ReadyForQuery; ``extra`` inserts messages before row i."""
    out = _msg(b"H", b"\x01" + struct.pack(">h", NCOLS) + b"\x00\x01" * NCOLS)
    header = SIGNATURE + struct.pack(">ii", 0, 0)
    for i, row in enumerate(rows):
        out += (extra or {}).get(i, b"")
        out += _msg(b"d", (header if i == 0 else b"") + row)
    out += _msg(b"d", (header if not rows else b"") + b"\xff\xff")
    out += end or (_msg(b"c", b"") + _msg(b"C", b"COPY 3\x00") + _msg(b"Z", b"T"))
    return out


def _frame_all(stream: bytes, cuts: list[int]) -> tuple[list[bytes], CopyOutFramer]:
    """Feed ``stream`` in pieces ending at ``cuts``, carrying what is not consumed."""
    framer = CopyOutFramer("test")
    rows: list[bytes] = []
    pending = b""
    last = 0
    for cut in [*cuts, len(stream)]:
        pending += stream[last:cut]
        last = cut
        buf = bytearray(pending + bytes(16))
        starts, ends, pos = framer.frame(np.frombuffer(buf, dtype=np.uint8), 0, len(pending))
        rows.extend(cc.RowSpans(buf, starts, ends).rows())
        pending = pending[pos:]
    assert pending == b""
    return rows, framer


# Values that imitate the start of a row message: 'd', a plausible length, NCOLS.
DECOY = b"d" + struct.pack(">i", 14) + struct.pack(">h", NCOLS) + b"d\x00\x00\x00\x06\x00\x02"
ROWS = [_tuple(struct.pack(">q", i), DECOY * (i % 3) + b"x" * i) for i in range(40)]
ROWS.append(_tuple(None, None))
ROWS.append(_tuple(struct.pack(">q", -1), b"d" * 30))


def test_rows_are_found_at_every_buffer_boundary() -> None:
    stream = _reply(ROWS)
    for step in (1, 3, 7, 64, 1000):
        rows, framer = _frame_all(stream, list(range(step, len(stream), step)))
        assert rows == ROWS
        assert framer.done and framer.complete and framer.error is None


def test_decoys_and_interleaved_messages() -> None:
    notice = _msg(b"N", b"SNOTICE\x00Mhello\x00\x00")
    status = _msg(b"S", b"application_name\x00x\x00")
    # a decoy row whose 'length' points exactly at the next real row
    tricky = _tuple(b"d" + struct.pack(">i", 4 + 2 + 4 + 8 + 4 + 3 - 0), b"abc")
    rows = [*ROWS[:5], tricky, *ROWS[5:]]
    stream = _reply(rows, extra={3: notice, 7: status + notice})
    got, framer = _frame_all(stream, [])
    assert got == rows and framer.done


def test_empty_result_header_with_trailer() -> None:
    rows, framer = _frame_all(_reply([]), [])
    assert rows == [] and framer.complete


def test_error_response_is_kept_until_ready_for_query() -> None:
    error = _msg(b"E", b"SERROR\x00VERROR\x00C22012\x00Mdivision by zero\x00\x00")
    end = error + _msg(b"Z", b"E")
    stream = _reply(ROWS[:3], end=b"")
    stream = stream[:stream.index(_msg(b"d", b"\xff\xff"))] + end
    rows, framer = _frame_all(stream, [len(stream) - 3])
    assert rows == ROWS[:3]
    assert framer.done and not framer.complete
    assert framer.error is not None and framer.error.sqlstate == "22012"
    assert framer.error.message == "ERROR:  division by zero"


@pytest.mark.parametrize(("stream", "match"), [
    (_msg(b"H", b"\x00" + struct.pack(">h", NCOLS)), "not in binary format"),
    (_msg(b"H", b"\x01" + struct.pack(">h", NCOLS)) + _msg(b"d", b"NOTPGCOPY..........."),
     "binary signature"),
    (_msg(b"H", b"\x01" + struct.pack(">h", NCOLS)) + b"d\x00\x00\x00\x02", "length 2"),
    (_msg(b"H", b"\x01" + struct.pack(">h", NCOLS))
     + _msg(b"d", SIGNATURE + struct.pack(">ii", 0, 0) + _tuple(b"1", b"2", b"3")),
     "3 fields, expected 2"),
    (_msg(b"d", b"x"), "before CopyOutResponse"),
    (_msg(b"T", b""), "unexpected protocol message 'T'"),
    (_reply([], end=_msg(b"d", _tuple(b"1", b"2"))), "after the binary COPY trailer"),
])
def test_malformed_streams_are_named(stream: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        _frame_all(stream, [])


def test_fields_of_framed_rows_decode() -> None:
    stream = _reply(ROWS)
    buf = bytearray(stream + bytes(16))
    framer = CopyOutFramer("test")
    starts, ends, pos = framer.frame(np.frombuffer(buf, dtype=np.uint8), 0, len(stream))
    assert pos == len(stream)
    rows = cc.split_fields(cc.RowSpans(buf, starts, ends), NCOLS)
    assert cc.fixed_values(rows, 0, ">i8").tolist() == [*range(40), 0, -1]
    assert cc.string_values(rows, 1).to_pylist()[40:] == [None, "d" * 30]


def test_the_socket_reader_refuses_impossible_message_lengths() -> None:
    from pgcdc_dagster.postgres.copy_socket import _needed

    assert _needed(bytearray(b"d\x00\x00\x00\x10xx"), 0, 7) == 17
    assert _needed(bytearray(b"d\x00\x00"), 0, 3) == 0  # the length is not in yet
    for length in (b"\x7f\xff\xff\xff", b"\x00\x00\x00\x02", b"\xff\xff\xff\xff"):
        with pytest.raises(DecodeError, match="protocol message 'd' with length"):
            _needed(bytearray(b"d" + length), 0, 5)
