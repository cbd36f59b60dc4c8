"""Column-wise binary COPY decoding: values, NULLs, and every malformed row named."""

from __future__ import annotations

import struct

import pytest

from pgcdc_dagster.cdc import copy_columns as cc
from pgcdc_dagster.exceptions import DecodeError


def _row(*fields: bytes | None) -> bytes:
    out = struct.pack(">h", len(fields))
    for f in fields:
        out += struct.pack(">i", -1) if f is None else struct.pack(">i", len(f)) + f
    return out


ROWS = [
    _row(struct.pack(">q", 7), b"short", struct.pack(">h", -3)),
    _row(None, b"a value longer than twelve bytes", None),
    _row(struct.pack(">q", -(2**63)), b"", struct.pack(">h", 32767)),
]


def test_values_nulls_and_strings_inline_or_referenced() -> None:
    rows = cc.split_fields(ROWS, 3)
    assert rows.num_rows == 3
    assert cc.fixed_values(rows, 0, ">i8").tolist() == [7, 0, -(2**63)]
    assert cc.nulls(rows, 0).tolist() == [False, True, False]
    assert cc.string_values(rows, 1).to_pylist() == [
        "short", "a value longer than twelve bytes", ""]
    assert cc.fixed_values(rows, 2, ">i2").tolist() == [-3, 0, 32767]
    assert cc.string_values(rows, 2).null_count == 1


def test_strings_of_every_length_around_the_inline_limit() -> None:
    """Values of 0..20 bytes (inline up to 12, referenced beyond) next to bytes that must not
    leak into them, with NULLs, after a skipped header byte, and the last row's value ending
    at the buffer's end: each string is exactly its value."""
    values = [bytes([0x41 + k % 26]) * k + "é".encode() * (k % 2) for k in range(21)]
    rows = [_row(v, b"\xff" * 16 if k % 3 else None, b"\x01" + v) for k, v in
            enumerate(values)] + [_row(None, None, None)]
    batch = cc.split_fields(rows[::-1] + rows, 3)
    want = [v.decode() for v in values] + [None]
    assert cc.string_values(batch, 0).to_pylist() == want[::-1] + want
    assert cc.string_values(batch, 2, skip=1).to_pylist() == want[::-1] + want
    assert cc.string_values(batch, 1).null_count == 2 * (7 + 1)


def test_skip_shorter_than_value_is_an_error() -> None:
    rows = cc.split_fields(ROWS, 3)
    with pytest.raises(DecodeError, match="row 2 column 1"):
        cc.string_values(rows, 1, skip=1)


def test_empty_batch() -> None:
    rows = cc.split_fields([], 2)
    assert rows.num_rows == 0
    assert cc.string_values(rows, 0).to_pylist() == []
    assert cc.fixed_values(rows, 1, ">i4").tolist() == []


@pytest.mark.parametrize(("rows", "message"), [
    ([_row(b"x", b"y")], "row 0 has 2 fields, expected 3"),
    ([ROWS[0], _row(b"x")], "row 1 has 1 fields"),
    ([ROWS[0][:-1]], "row 0's fields end at byte"),
    ([ROWS[0] + b"\x00"], "row 0's fields end at byte"),
    ([struct.pack(">h", 3) + struct.pack(">i", -2) + b"\x00" * 20], "length -2"),
    ([struct.pack(">h", 3) + b"\x00\x00"], "ends inside the length of column 0"),
    ([b"\x00"], "row 0 is shorter than its field count"),
    # a length that points far past the buffer: the next length is never read
    ([struct.pack(">hi", 3, 100_000) + b"x" * 8], "ends inside the length of column 1"),
])
def test_malformed_rows_are_named(rows: list[bytes], message: str) -> None:
    with pytest.raises(DecodeError, match=message.replace("(", r"\(")):
        cc.split_fields(rows, 3, label="chunk x")


def test_fixed_width_mismatch() -> None:
    rows = cc.split_fields(ROWS, 3)
    with pytest.raises(DecodeError, match="row 0 column 1: 5 bytes where 8"):
        cc.fixed_values(rows, 1, ">i8")
