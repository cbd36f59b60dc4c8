"""COPY BINARY parsing on streams recorded from PostgreSQL 15, fed in chunks of any size."""

from __future__ import annotations

import random
import struct

import pytest

from pgcdc_dagster.cdc.pgcopy import (
    SIGNATURE,
    CopyBinaryParser,
    CopyBinarySink,
    SlotRowSink,
    parse_copy_binary,
)
from pgcdc_dagster.cdc.pgoutput.assembler import Assembler, assemble
from pgcdc_dagster.cdc.pgoutput.decoder import decode
from pgcdc_dagster.cdc.pgoutput.messages import Insert
from pgcdc_dagster.exceptions import DecodeError
from tests.data.pgoutput.fixtures import copy_binary, load

pytestmark = pytest.mark.unit


def _recorded() -> tuple[bytes, list[tuple[bytes | None, ...]]]:
    doc = copy_binary()
    expected = [tuple(None if v is None else bytes.fromhex(v) for v in row)
                for row in doc["expected"]]  # type: ignore[union-attr]
    return bytes.fromhex(doc["hex"]), expected  # type: ignore[arg-type]


def _feed(stream: bytes, sizes: list[int]) -> list[tuple[bytes | None, ...]]:
    parser = CopyBinaryParser()
    rows, pos = [], 0
    for size in sizes:
        rows += parser.feed(stream[pos:pos + size])
        pos += size
    rows += parser.feed(stream[pos:])
    parser.close()
    assert parser.finished and parser.tuples == len(rows)
    return rows


def test_whole_stream_matches_the_send_functions() -> None:
    stream, expected = _recorded()
    assert parse_copy_binary(stream) == expected
    assert expected[2][0] is None and expected[1][1] == b"" and len(expected[2][1]) == 100_000


@pytest.mark.parametrize("size", [1, 2, 3, 5, 19, 21, 64, 4096])
def test_fixed_chunk_sizes(size: int) -> None:
    stream, expected = _recorded()
    assert _feed(stream, [size] * (len(stream) // size)) == expected


def test_random_chunking() -> None:
    stream, expected = _recorded()
    rng = random.Random(7)
    for _ in range(50):
        sizes = [rng.randint(0, 300) for _ in range(len(stream) // 100)]
        assert _feed(stream, sizes) == expected


def test_header_extension_is_skipped() -> None:
    stream, expected = _recorded()
    extended = stream[:15] + struct.pack(">i", 3) + b"abc" + stream[19:]
    assert _feed(extended, [1] * 30) == expected


def test_sink_calls_back_per_tuple() -> None:
    stream, expected = _recorded()
    seen: list[tuple[bytes | None, ...]] = []
    sink = CopyBinarySink(seen.append)
    for i in range(0, len(stream), 1000):
        assert sink.write(stream[i:i + 1000]) == len(stream[i:i + 1000])
    assert seen == expected and sink.bytes == len(stream)
    sink.parser.close()


@pytest.mark.parametrize(("mutate", "pattern"), [
    (lambda s: b"PGCOPX" + s[6:], r"bad signature .* at stream offset 0"),
    (lambda s: s[:11] + struct.pack(">i", 1 << 16) + s[15:], r"OIDs flag"),
    (lambda s: s[:15] + struct.pack(">i", -1) + s[19:], r"header extension length -1"),
    (lambda s: s[:19] + struct.pack(">h", -2) + s[21:], r"field count -2 at stream offset 19"),
    (lambda s: s[:21] + struct.pack(">i", -5) + s[25:], r"field length -5 at stream offset 21"),
    (lambda s: s + b"x", r"1 bytes after the trailer"),
])
def test_malformed_streams(mutate, pattern: str) -> None:
    stream, _ = _recorded()
    with pytest.raises(DecodeError, match=pattern):
        parse_copy_binary(mutate(stream))


@pytest.mark.parametrize("cut", [5, 19, 24, -1, -3])
def test_incomplete_stream_is_reported_at_close(cut: int) -> None:
    stream, _ = _recorded()
    parser = CopyBinaryParser()
    parser.feed(stream[:cut])
    assert not parser.finished
    with pytest.raises(DecodeError, match="stream ended early"):
        parser.close()


def test_data_after_the_trailer_in_a_later_chunk() -> None:
    stream, _ = _recorded()
    parser = CopyBinaryParser()
    parser.feed(stream)
    assert parser.feed(b"") == []
    with pytest.raises(DecodeError, match="after the trailer"):
        parser.feed(b"\x00")


def copy_binary_header() -> bytes:
    return SIGNATURE + struct.pack(">ii", 0, 0)


def _copy_rows(stream: bytes) -> list[bytes]:
    """Split a COPY stream the way libpq delivers it: one CopyData message per row."""
    chunks, pos, first = [], 19, True
    while True:
        (nfields,) = struct.unpack_from(">h", stream, pos)
        if nfields == -1:
            chunks.append(stream[pos:])
            return chunks
        end = pos + 2
        for _ in range(nfields):
            (length,) = struct.unpack_from(">i", stream, end)
            end += 4 + max(length, 0)
        chunks.append(stream[0 if first else pos:end])
        first, pos = False, end


@pytest.mark.parametrize("name", ["multi_table", "schema_change"])
def test_copy_sink_feeds_the_assembler_per_row_and_in_odd_chunks(name: str) -> None:
    recorded = load(name)
    assert recorded.copy is not None
    expected = assemble(recorded.items())
    per_row = _copy_rows(recorded.copy)
    rng = random.Random(3)
    cuts = sorted(rng.sample(range(1, len(recorded.copy)), 40))
    odd = [recorded.copy[a:b] for a, b in zip([0, *cuts], [*cuts, len(recorded.copy)],
                                              strict=True)]
    for chunks in (per_row, odd, [recorded.copy]):
        assembler = Assembler()
        sink = assembler.copy_sink()
        for chunk in chunks:
            sink.write(chunk)
        sink.close()
        assert sink.byte_count == len(recorded.copy)
        assert assembler.finish() == expected


def test_slot_row_sink_reads_rows_whole_and_split() -> None:
    """Other plugins' peeks: a whole row per write takes one unpack, anything else the
    parser; both hand over the same (lsn, data) pairs."""
    recorded = load("multi_table")
    assert recorded.copy is not None
    expected = [(lsn, bytes(data)) for lsn, data in recorded.items()]
    rng = random.Random(5)
    cuts = sorted(rng.sample(range(1, len(recorded.copy)), 40))
    odd = [recorded.copy[a:b] for a, b in zip([0, *cuts], [*cuts, len(recorded.copy)],
                                              strict=True)]
    for chunks in (_copy_rows(recorded.copy), odd, [recorded.copy]):
        got: list[tuple[int, bytes]] = []
        sink = SlotRowSink(lambda lsn, data, got=got: got.append((lsn, bytes(data))))
        for chunk in chunks:
            sink.write(chunk)
        sink.close()
        assert got == expected and sink.rows == len(expected)
    sink = SlotRowSink(lambda lsn, data: None)
    sink.write(copy_binary_header())
    with pytest.raises(DecodeError, match="unexpected shape"):
        sink.write(struct.pack(">hi", 1, 0))  # a row of one field
    with pytest.raises(DecodeError, match="ended early"):
        SlotRowSink(lambda lsn, data: None).close()


def test_copy_sink_keeps_the_first_error_and_drains() -> None:
    recorded = load("multi_table")
    assert recorded.copy is not None
    rows = _copy_rows(recorded.copy)
    assembler = Assembler()
    sink = assembler.copy_sink()
    sink.write(rows[0])
    sink.write(rows[1][:26] + b"Z" + rows[1][27:])  # unknown message type
    sink.write(rows[2])
    with pytest.raises(DecodeError, match="unknown pgoutput message type 'Z'"):
        sink.close()


def _frame(lsn: int, message: bytes) -> bytes:
    """One slot row as COPY BINARY frames it: (lsn int8, xid int4, data bytea)."""
    return (struct.pack(">hiqiIi", 3, 8, lsn, 4, 0, len(message)) + message)


def _tuple(values: list[bytes | None | str]) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "toast":
            out += b"u"
        else:
            assert isinstance(v, bytes)
            out += b"t" + struct.pack(">I", len(v)) + v
    return out


def test_speculative_layouts_are_exact_against_the_generic_parser() -> None:
    """Rows with repeating, shifting and colliding layouts, through the COPY fast path and
    Assembler.feed (both learn whole-tuple layouts) against the message decoder."""
    begin, relation, *_ = load("basic").items()
    oid = struct.unpack_from(">I", relation[1], 1)[0]
    rng = random.Random(5)
    messages: list[bytes] = []
    for i in range(3000):
        if i % 500 < 250:  # bulk-like: one layout for long stretches
            values = [b"%06d" % i, b"name", b"1.50", None, b"x" * 10]
        else:  # same total size, shifting boundaries, NULLs and unchanged TOAST
            cut = rng.randint(0, 6)
            values = [b"a" * cut, b"b" * (6 - cut), rng.choice([b"", None]),
                      rng.choice([None, "toast", b"t"]), b"%d" % rng.randint(0, 10)]
        code = rng.choice([b"I", b"U"])
        messages.append(code + struct.pack(">I", oid) + b"N" + _tuple(values))
    commit_lsn = struct.unpack_from(">Q", begin[1], 1)[0]
    commit = b"C\x00" + struct.pack(">QQq", commit_lsn, commit_lsn + 100, 0)
    items = [begin, relation, *[(1000 + i, msg) for i, msg in enumerate(messages)],
             (commit_lsn + 100, commit)]
    reference = [(("c" if isinstance(msg, Insert) else "u"), msg.new.values)
                 for msg in (decode(m) for m in messages)]
    expected = assemble(items)  # the feed path (also speculative)
    segment = expected.tables[("public", "t_default")][0]
    assert list(zip(segment.op, segment.after, strict=True)) == reference
    assembler = Assembler()
    sink = assembler.copy_sink()
    header = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
    sink.write(header + _frame(*items[0]))
    for lsn, msg in items[1:]:
        sink.write(_frame(lsn, msg))
    sink.write(b"\xff\xff")
    sink.close()
    assert assembler.finish() == expected  # the COPY fast path
