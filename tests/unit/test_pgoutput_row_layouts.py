"""The COPY fast paths (learnt tuple layouts, whole-row layouts) against the general parser.

Synthetic pgoutput streams (fixed seeds) of one relation with text, binary, NULL and
unchanged-TOAST columns whose kinds and value lengths repeat in runs and change at random,
mixed with updates carrying old tuples, deletes and a second table: fed as COPY rows through
``copy_sink`` (where the speculative layouts apply) and message by message through
``Assembler.feed`` (plain parsing), the windows must be identical, also in portions.
"""

from __future__ import annotations

import random
import struct

import pytest

from pgcdc_dagster.cdc.changes import Window
from pgcdc_dagster.cdc.pgoutput.assembler import Assembler
from tests.support.portions import columns, merge_portions

pytestmark = pytest.mark.unit

_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
NCOLS = 5


def _relation(oid: int, name: bytes, ncols: int) -> bytes:
    cols = b"".join(bytes([1 if i == 0 else 0]) + b"c%d\x00" % i + struct.pack(">Ii", 25, -1)
                    for i in range(ncols))
    return b"R" + struct.pack(">I", oid) + b"public\x00" + name + b"\x00d" + \
        struct.pack(">h", ncols) + cols


def _tuple(rng: random.Random, shape: list[tuple[bytes, int]]) -> bytes:
    out = [struct.pack(">h", len(shape))]
    for kind, length in shape:
        if kind in b"tb":
            value = bytes(rng.choice(b"abcdefgh0123") for _ in range(length))
            out.append(kind + struct.pack(">I", length) + value)
        else:
            out.append(kind)
    return b"".join(out)


def _shape(rng: random.Random) -> list[tuple[bytes, int]]:
    kinds = [b"t", b"t", b"t", b"b", b"n", b"u"]
    return [(b"t", rng.randint(1, 3))] + [(rng.choice(kinds), rng.choice([0, 1, 4, 12, 40]))
                                          for _ in range(NCOLS - 1)]


def _stream(seed: int) -> list[tuple[int, int, bytes]]:
    """(lsn, xid, message) rows of a few transactions."""
    rng = random.Random(seed)
    rows: list[tuple[int, int, bytes]] = []
    lsn = 1 << 24
    for txn in range(6):
        xid, commit_lsn = 700 + txn, lsn + 100_000
        rows.append((lsn, xid, b"B" + struct.pack(">QqI", commit_lsn, 1000 + txn, xid)))
        if txn in (0, 3):
            rows.append((lsn, xid, _relation(16384, b"t", NCOLS)))
            rows.append((lsn, xid, _relation(16390, b"other", 2)))
        shape, run_code, kind = _shape(rng), b"I", 0.5
        for _ in range(rng.randint(100, 600)):
            lsn += 1
            if rng.random() < 0.02:
                shape = _shape(rng)
            if rng.random() < 0.03:
                run_code = rng.choice([b"I", b"U"])
                kind = rng.choice([0.5, 0.5, 0.5, 0.83, 0.9, 0.95])
            roll = kind if rng.random() < 0.9 else rng.random()
            if roll < 0.80:
                code = run_code
                body = struct.pack(">I", 16384) + b"N" + _tuple(rng, shape)
            elif roll < 0.86:
                code, body = b"U", struct.pack(">I", 16384) + b"K" + _tuple(
                    rng, [(b"t", 2)] + [(b"n", 0)] * (NCOLS - 1)) + b"N" + _tuple(rng, shape)
            elif roll < 0.92:
                code, body = b"D", struct.pack(">I", 16384) + b"K" + _tuple(
                    rng, [(b"t", 2)] + [(b"n", 0)] * (NCOLS - 1))
            else:
                code, body = b"I", struct.pack(">I", 16390) + b"N" + _tuple(
                    rng, [(b"t", 3), (b"t", rng.choice([2, 3]))])
            rows.append((lsn, xid, code + body))
        lsn = commit_lsn
        rows.append((lsn, xid, b"C" + struct.pack(">BQQq", 0, commit_lsn, commit_lsn + 40,
                                                  1000 + txn)))
        lsn += 100
    return rows


def _copy(rows: list[tuple[int, int, bytes]], portion: int | None) -> tuple[Window, list[Window]]:
    portions: list[Window] = []
    kwargs = {} if portion is None else {"portion_changes": portion,
                                         "on_portion": portions.append}
    assembler = Assembler(**kwargs)  # type: ignore[arg-type]
    sink = assembler.copy_sink()
    chunks = [struct.pack(">hiqiIi", 3, 8, lsn, 4, xid, len(data)) + data
              for lsn, xid, data in rows]
    for chunk in [_HEADER + chunks[0], *chunks[1:], struct.pack(">h", -1)]:
        sink.write(chunk)
    sink.close()
    assert sink.row_count == len(rows)
    return assembler.finish(), portions


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_copy_fast_paths_equal_plain_parsing(seed: int) -> None:
    rows = _stream(seed)
    plain = Assembler()
    for lsn, _, data in rows:
        plain.feed(lsn, data)
    expected = plain.finish()
    assert expected.change_count > 600
    window, _ = _copy(rows, None)
    assert columns(window) == columns(expected)
    assert window.transactions == expected.transactions
    for portion in (1, 37, 500):
        final, portions = _copy(rows, portion)
        assert columns(merge_portions(portions, final)) == columns(expected)
