"""The compiled framing and field walk (pgcdc_dagster/native) give exactly what the numpy
code gives, on randomised well-formed and malformed COPY replies; the library is built
atomically by concurrent builders and the numpy code runs when it cannot be built."""

from __future__ import annotations

import logging
import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pgcdc_dagster.cdc import copy_columns as cc
from pgcdc_dagster.cdc.copy_frames import CopyOutFramer
from pgcdc_dagster.cdc.pgcopy import SIGNATURE
from pgcdc_dagster.exceptions import DecodeError
from pgcdc_dagster.native import build, copyscan

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_library() -> Iterator[None]:
    copyscan._load.cache_clear()
    yield
    copyscan._load.cache_clear()


@pytest.fixture
def native() -> copyscan.CopyScan:
    lib = copyscan.library()
    assert lib is not None, "the test machine has a C compiler: the library must build"
    return lib


def _msg(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack(">i", len(body) + 4) + body


def _tuple(fields: list[bytes | None]) -> bytes:
    out = struct.pack(">h", len(fields))
    for f in fields:
        out += struct.pack(">i", -1) if f is None else struct.pack(">i", len(f)) + f
    return out


def _value(rng: random.Random, ncols: int) -> bytes | None:
    kind = rng.random()
    if kind < 0.15:
        return None
    if kind < 0.25:
        return b""
    if kind < 0.35:  # imitates a row message's header
        return b"d" + struct.pack(">i", rng.choice([6, 14, 40])) + struct.pack(">h", ncols)
    if kind < 0.40:
        return rng.randbytes(rng.randint(1000, 70_000))
    return rng.randbytes(rng.randint(1, 30))


def _rows(rng: random.Random, ncols: int, count: int) -> list[bytes]:
    return [_tuple([_value(rng, ncols) for _ in range(ncols)]) for _ in range(count)]


def _reply(rng: random.Random, ncols: int, rows: list[bytes]) -> bytes:
    """CopyOutResponse, the header with the first row, rows (notices between some), the
    trailer, CopyDone, CommandComplete, ReadyForQuery."""
    out = _msg(b"H", b"\x01" + struct.pack(">h", ncols) + b"\x00\x01" * ncols)
    header = SIGNATURE + struct.pack(">ii", 0, 0)
    for i, row in enumerate(rows):
        if rng.random() < 0.03:
            out += _msg(rng.choice([b"N", b"S"]), b"Mnote\x00\x00")
        out += _msg(b"d", (header if i == 0 else b"") + row)
    out += _msg(b"d", (header if not rows else b"") + b"\xff\xff")
    return out + _msg(b"c", b"") + _msg(b"C", b"COPY 1\x00") + _msg(b"Z", b"I")


Framed = list[tuple[list[int], list[int], int]]


def _frame(stream: bytes, cuts: list[int]) -> tuple[Framed, tuple[bool, bool]] | str:
    """What the framer returns for each receive buffer (the stream cut at ``cuts``), or the
    DecodeError it raises."""
    framer = CopyOutFramer("test")
    out: Framed = []
    pending = b""
    last = 0
    try:
        for cut in [*cuts, len(stream)]:
            pending += stream[last:cut]
            last = cut
            data = np.frombuffer(bytearray(pending + bytes(16)), dtype=np.uint8)
            starts, ends, pos = framer.frame(data, 0, len(pending))
            out.append((starts.tolist(), ends.tolist(), pos))
            pending = pending[pos:]
    except DecodeError as exc:
        return f"DecodeError: {exc}"
    return out, (framer.done, framer.complete)


def _both(monkeypatch: pytest.MonkeyPatch, run: Callable[[], object]) -> tuple[object, object]:
    monkeypatch.setenv(copyscan.ENV, "on")
    on = run()
    monkeypatch.setenv(copyscan.ENV, "off")
    off = run()
    monkeypatch.delenv(copyscan.ENV)
    return on, off


def _cuts(rng: random.Random, size: int) -> list[int]:
    """Receive-buffer ends: anywhere, so rows and message headers are split."""
    return sorted(rng.sample(range(1, size), min(size - 1, rng.randint(0, 12))))


def test_framing_matches_numpy_on_random_replies(monkeypatch: pytest.MonkeyPatch,
                                                 native: copyscan.CopyScan) -> None:
    for seed in range(60):
        rng = random.Random(seed)
        ncols = rng.randint(0, 6)
        rows = _rows(rng, ncols, rng.choice([0, 1, 5, 300]))
        stream = _reply(rng, ncols, rows)
        cuts = _cuts(rng, len(stream))
        on, off = _both(monkeypatch, lambda: _frame(stream, cuts))  # noqa: B023
        assert on == off, seed
        assert not isinstance(on, str) and on[1] == (True, True), seed
        assert sum(len(s) for s, _e, _p in on[0]) == len(rows), seed


def _corrupt(rng: random.Random, stream: bytes) -> bytes:
    data = bytearray(stream)
    what = rng.randrange(4)
    at = rng.randrange(len(data))
    if what == 0:  # one byte changed (a length, a field count, a message type...)
        data[at] = rng.randrange(256)
    elif what == 1:  # a 'd' with a bad length
        data[at:at + 5] = b"d" + struct.pack(">i", rng.choice([0, 2, 5, -7, 2**31 - 1]))
    elif what == 2:  # truncated: the reply ends inside a message
        return bytes(data[:at])
    else:  # a row with another field count
        at = stream.find(b"d", at)
        data[at + 5:at + 7] = struct.pack(">h", rng.randrange(-2, 9))
    return bytes(data)


def test_framing_errors_match_numpy_on_corrupted_replies(monkeypatch: pytest.MonkeyPatch,
                                                         native: copyscan.CopyScan) -> None:
    errors = 0
    for seed in range(300):
        rng = random.Random(seed)
        ncols = rng.randint(0, 4)
        stream = _corrupt(rng, _reply(rng, ncols, _rows(rng, ncols, rng.randint(1, 40))))
        cuts = _cuts(rng, max(len(stream), 2))
        on, off = _both(monkeypatch, lambda: _frame(stream, cuts))  # noqa: B023
        assert on == off, seed
        errors += isinstance(on, str)
    assert errors > 50  # the corruptions mostly break the stream


def _spans(rows: list[bytes], rng: random.Random) -> cc.RowSpans:
    """The rows in one buffer, with bytes between them (as in a receive buffer)."""
    buf, start, end = bytearray(), [], []
    for row in rows:
        buf += rng.randbytes(rng.choice([0, 0, 5]))
        start.append(len(buf))
        buf += row
        end.append(len(buf))
    return cc.RowSpans(bytes(buf + bytes(16)), np.array(start, dtype=np.int64),
                       np.array(end, dtype=np.int64))


def _walk(spans: cc.RowSpans, ncols: int) -> object:
    try:
        rows = cc.split_fields(spans, ncols, label="t")
    except DecodeError as exc:
        return f"DecodeError: {exc}"
    assert len(rows.starts) == len(rows.lengths) == ncols
    assert all(s.dtype == np.int64 and x.dtype == np.int32
               for s, x in zip(rows.starts, rows.lengths, strict=True))
    return ([s.tolist() for s in rows.starts], [x.tolist() for x in rows.lengths],
            rows.num_rows)


def test_field_walk_matches_numpy(monkeypatch: pytest.MonkeyPatch,
                                  native: copyscan.CopyScan) -> None:
    for seed in range(80):
        rng = random.Random(seed)
        ncols = rng.randint(0, 7)
        spans = _spans(_rows(rng, ncols, rng.choice([0, 1, 3, 500])), rng)
        on, off = _both(monkeypatch, lambda: _walk(spans, ncols))  # noqa: B023
        assert on == off, seed
        assert not isinstance(on, str), (seed, on)


def _bad_row(rng: random.Random, ncols: int) -> bytes:
    """A malformed row of one kind or another."""
    fields = [_value(rng, ncols) for _ in range(ncols)]
    row = bytearray(_tuple(fields))
    kind = rng.randrange(5)
    if kind == 0:  # another field count
        row[0:2] = struct.pack(">h", ncols + rng.choice([-1, 1, 100]))
    elif kind == 1 and ncols:  # a length below -1
        row[2:6] = struct.pack(">i", rng.choice([-2, -100, -(2**31)]))
    elif kind == 2 and ncols:  # a field that overruns the row
        row[2:6] = struct.pack(">i", len(row) + rng.randint(0, 2**30))
    elif kind == 3:  # truncated
        return bytes(row[:rng.randrange(len(row))])
    else:  # bytes left over after the last field
        row += b"\x00" * rng.randint(1, 5)
    return bytes(row)


def test_field_walk_errors_match_numpy(monkeypatch: pytest.MonkeyPatch,
                                       native: copyscan.CopyScan) -> None:
    for seed in range(200):
        rng = random.Random(seed)
        ncols = rng.randint(0, 5)
        rows = _rows(rng, ncols, rng.randint(1, 30))
        rows.insert(rng.randrange(len(rows) + 1), _bad_row(rng, ncols))
        spans = _spans(rows, rng)
        on, off = _both(monkeypatch, lambda: _walk(spans, ncols))  # noqa: B023
        assert on == off, seed


def test_walk_refuses_each_fault_itself(native: copyscan.CopyScan) -> None:
    """Rows that end exactly where their fields do, but with a fault only a check catches
    (so a skipped check in the C code fails here, not only in the careful walk)."""
    good = _tuple([b"ab", None])
    cases = {
        "length below -1": struct.pack(">hii", 2, -2, 0),
        "field count": struct.pack(">hi", 1, 2) + b"ab" + struct.pack(">i", -1),
        "field past the row": struct.pack(">hi", 2, 6) + b"ab" + struct.pack(">i", -1),
        "length past the row": struct.pack(">hi", 2, 0) + b"\x00\x00",
        "too short": b"\x00",
        "left over": good + b"x",
    }
    for name, row in cases.items():
        spans = cc.join_rows([good, row, good])
        data = np.frombuffer(spans.data, dtype=np.uint8)
        assert native.walk_fields(data, spans.start, spans.end, 2) is None, name
        with pytest.raises(DecodeError, match="row 1"):
            cc.split_fields(spans, 2)
    spans = cc.join_rows([good, good])
    data = np.frombuffer(spans.data, dtype=np.uint8)
    walked = native.walk_fields(data, spans.start, spans.end, 2)
    assert walked is not None and walked[1].tolist() == [[2, 2], [-1, -1]]
    # a row said to end past the buffer is refused, never read
    assert native.walk_fields(data[:int(spans.end[-1]) - 1], spans.start, spans.end, 2) is None
    assert native.walk_fields(data, np.array([-1]), np.array([5]), 2) is None


def test_framing_stops_where_numpy_hands_over(native: copyscan.CopyScan) -> None:
    """Rows are taken up to the first message that is not a complete row of ncols fields."""
    rows = [_msg(b"d", _tuple([b"x" * i, None])) for i in range(3)]
    other = [_msg(b"d", b"\xff\xff"), _msg(b"d", _tuple([b"x"])), b"d\x00\x00\x00\x05\x00\x02",
             _msg(b"N", b"\x00"), b"d" + struct.pack(">I", 2**31) + b"\x00\x02"]
    for tail in other:
        data = np.frombuffer(b"".join(rows) + tail + bytes(16), dtype=np.uint8)
        size = len(data) - 16
        starts, ends, stop = native.frame_rows(data, 0, size, 2)
        assert stop == sum(map(len, rows)), tail
        assert [bytes(data[s:e]) for s, e in zip(starts, ends, strict=True)] == \
            [r[5:] for r in rows]
    # a row cut by the buffer's end stays for the next buffer, even one byte short
    data = np.frombuffer(b"".join(rows) + bytes(16), dtype=np.uint8)
    for end in range(len(rows[0]) + len(rows[1]), sum(map(len, rows))):
        assert native.frame_rows(data, 0, end, 2)[2] == len(rows[0]) + len(rows[1])


def test_off_forces_numpy_and_other_values_are_refused(monkeypatch: pytest.MonkeyPatch,
                                                       native: copyscan.CopyScan) -> None:
    monkeypatch.setenv(copyscan.ENV, "off")
    assert copyscan.library() is None
    monkeypatch.setenv(copyscan.ENV, "maybe")
    with pytest.raises(ValueError, match="PGCDC_NATIVE='maybe'"):
        copyscan.library()


def _builders(env: dict[str, str], count: int) -> list[subprocess.CompletedProcess[str]]:
    procs = [subprocess.Popen([sys.executable, "-m", "pgcdc_dagster.native.build"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(count)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def test_concurrent_builders_leave_one_whole_library(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = _builders(env, 6)
    assert [d.returncode for d in done] == [0] * 6, [d.stderr for d in done]
    paths = {d.stdout.strip() for d in done}
    assert len(paths) == 1
    files = sorted(p.name for p in (tmp_path / "pgcdc_dagster").iterdir())
    assert files == [Path(paths.pop()).name]  # no temporary file left behind
    assert files[0].startswith("copyscan-") and files[0].endswith(".so")
    # the built library is the one a worker loads
    probe = ("from pgcdc_dagster.native import copyscan, build; "
             "assert copyscan.library() is not None; print(build.library_path())")
    loaded = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                            text=True, check=True)
    assert Path(loaded.stdout.strip()).name == files[0]


def test_without_a_compiler_numpy_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    caplog.set_level(logging.INFO, logger=copyscan.__name__)
    assert copyscan.library() is None
    assert copyscan.library() is None
    said = [r for r in caplog.records if r.name == copyscan.__name__]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert "no C compiler" in said[0].getMessage() and "gcc" in said[0].getMessage()
    # the reader still works, on numpy
    rows = cc.split_fields([_tuple([b"abc", None])], 2)
    assert rows.lengths[0].tolist() == [3] and rows.lengths[1].tolist() == [-1]
    # no cc on PATH at all (CC unset), in a fresh process
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    env.update(XDG_CACHE_HOME=str(tmp_path), PATH=str(tmp_path), PYTHONPATH=str(ROOT))
    probe = ("from pgcdc_dagster.native import copyscan; import logging, sys; "
             "logging.basicConfig(level=logging.INFO, stream=sys.stdout); "
             "print(copyscan.library())")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip().endswith("None") and "numpy runs them" in out
    assert not any(tmp_path.glob("pgcdc_dagster/*.so"))


def test_an_unwritable_cache_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with pytest.raises(build.BuildError, match="cannot write the native library"):
        build.build()
    assert copyscan.library() is None


def _numeric_bytes(rng: random.Random, scale: int) -> bytes | None:
    """A NUMERIC's binary value: mostly ordinary ones, some the compiled code must hand to
    numpy (NaN, infinities, too many digits, odd digits, wrong lengths, beyond int64)."""
    from tests.unit.test_snapshot_binary_numeric import numeric_send

    kind = rng.random()
    if kind < 0.1:
        return None
    if kind < 0.75:
        digits = rng.randint(1, 18)
        unscaled = rng.randrange(10 ** (digits - 1), 10**digits) * rng.choice([1, -1])
        return numeric_send(Decimal(unscaled).scaleb(-scale))
    if kind < 0.8:
        return numeric_send(Decimal(rng.randrange(1, 10**6)).scaleb(-scale - rng.randint(1, 30)))
    if kind < 0.85:  # beyond the precision (the float bound), up to beyond int64
        return numeric_send(Decimal(rng.randrange(10**17, 10**20)).scaleb(rng.randint(0, 3)))
    if kind < 0.9:
        return struct.pack(">hhHh", 0, 0, rng.choice([0xC000, 0xD000, 0xF000, 0x8000]), 0)
    ndigits = rng.randint(0, 6)  # random header and digits
    body = struct.pack(">hhHh", ndigits, rng.randint(-6, 6), rng.choice([0, 0x4000, 1]), 0)
    body += b"".join(struct.pack(">h", rng.choice([0, 1, 9999, 10000, -1, rng.randint(0, 9999)]))
                     for _ in range(ndigits))
    return body[:rng.choice([len(body), len(body), max(len(body) - 2, 0), 6])] \
        + b"\x00" * rng.choice([0, 0, 0, 2])


def test_numeric_matches_numpy(monkeypatch: pytest.MonkeyPatch,
                               native: copyscan.CopyScan) -> None:
    from pgcdc_dagster.capture import snapshot_binary as sb
    from pgcdc_dagster.cdc.typeconv import PgType, TypeModes, converter_for

    handed_over = decoded = 0
    for seed in range(400):
        rng = random.Random(seed)
        precision = rng.randint(1, 18)
        scale = rng.randint(0, precision)
        conv = converter_for("n", PgType(0, "pg_catalog", "numeric", "b", "N"),
                             ((precision << 16) | scale) + 4, TypeModes(),
                             nullable=rng.random() < 0.8)
        good = rng.random() < 0.5  # half the batches only ordinary values
        values = [_numeric_bytes(rng, scale) for _ in range(rng.choice([1, 5, 200]))]
        if good:
            values = [v for v in values if v is None or
                      native.numeric_unscaled(*_one(v), scale, sb._POW10_FLOAT, 1e18) is not None]
        rows = cc.split_fields([_tuple([v]) for v in values], 1)

        def convert() -> object:
            try:
                bronze, silver = sb.convert_column(conv, "numeric", rows, 0)  # noqa: B023
            except Exception as exc:  # the same error either way
                return f"{type(exc).__name__}: {exc}"
            return bronze.to_pylist(), silver.to_pylist(), bronze.type, silver.type

        on, off = _both(monkeypatch, convert)
        assert on == off, (seed, precision, scale)
        scan = native.numeric_unscaled(rows.data, rows.starts[0], rows.lengths[0], scale,
                                       sb._POW10_FLOAT, 1e18)
        handed_over += scan is None
        decoded += scan is not None and len(values) > 1
    assert handed_over > 50 and decoded > 50


def _one(value: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = cc.split_fields([_tuple([value])], 1)
    return rows.data, rows.starts[0], rows.lengths[0]


def test_numeric_hands_over_each_odd_value(native: copyscan.CopyScan) -> None:
    """Values the compiled code must leave to numpy, even where it could compute them (so
    a skipped check fails here)."""
    from pgcdc_dagster.capture import snapshot_binary as sb

    def numeric(ndigits: int, weight: int, sign: int, *digits: int) -> bytes:
        return struct.pack(f">hhHh{len(digits)}h", ndigits, weight, sign, 0, *digits)

    cases = {
        "leading zero digit": numeric(2, 1, 0, 0, 1234),
        "digit above 9999": numeric(2, 1, 0, 1, 10000),
        "negative digit": numeric(2, 1, 0, 1, -1),
        "beyond the bound (5e16 at scale 2)": numeric(1, 4, 0, 5),
        "NaN": numeric(0, 0, 0xC000),
        "+infinity": numeric(0, 0, 0xD000),
        "length": numeric(2, 0, 0, 1),
        "digits past the scale": numeric(2, 0, 0, 1, 5),
    }
    ok = numeric(2, 0, 0x4000, 12, 3400)  # -12.34
    for name, value in cases.items():
        rows = cc.split_fields([_tuple([ok]), _tuple([value])], 1)
        got = native.numeric_unscaled(rows.data, rows.starts[0], rows.lengths[0], 2,
                                      sb._POW10_FLOAT, 1e18)
        assert got is None, name
    rows = cc.split_fields([_tuple([ok]), _tuple([None]), _tuple([numeric(1, 3, 0, 4)])], 1)
    got = native.numeric_unscaled(rows.data, rows.starts[0], rows.lengths[0], 2,
                                  sb._POW10_FLOAT, 1e18)
    assert got is not None and got.tolist() == [-1234, 0, 4 * 10**14]


def test_zoned_timestamps_match_numpy(monkeypatch: pytest.MonkeyPatch,
                                      native: copyscan.CopyScan) -> None:
    from pgcdc_dagster.capture import snapshot_binary as sb

    day = 86_400_000_000
    edges = [sb.MIN_MICROS, sb.MAX_MICROS, sb.MAX_MICROS + day - 1, 0, -1, 1, -day, day - 1,
             951_782_400_000_000, 951_868_799_999_999, -2_203_891_200_000_000,  # 2000-02-29
             -62_135_596_800_000_000 + 1]
    for seed in range(40):
        rng = random.Random(seed)
        n = rng.choice([1, 7, 3000])
        micros = np.array([rng.choice(edges) if rng.random() < 0.2 else
                           rng.randint(sb.MIN_MICROS, sb.MAX_MICROS + day - 1)
                           for _ in range(n)], dtype=np.int64)
        if seed % 3 == 0:  # a narrow span of days (the numpy code's day table)
            micros = micros % (40 * day) + 1_600_000_000_000_000
        null = np.array([rng.random() < (0.3 if seed % 2 else 0.0) for _ in range(n)])
        for width in (None, 0, 1, 2, 3, 4, 5, 6):
            on, off = _both(monkeypatch,
                            lambda: sb._zoned_strings(micros, null, width))  # noqa: B023
            assert isinstance(on, pa.StringArray) and isinstance(off, pa.StringArray)
            assert on.equals(off), (seed, width)
    # the text itself, around the edges
    got = sb._zoned_strings(np.array([sb.MIN_MICROS, -1, 951_782_400_123_456]),
                            np.zeros(3, dtype=np.bool_), 4).to_pylist()
    assert got == ["0001-01-01T00:00:00.0000Z", "1969-12-31T23:59:59.9999Z",
                   "2000-02-29T00:00:00.1234Z"]


def test_strings_match_numpy(monkeypatch: pytest.MonkeyPatch,
                             native: copyscan.CopyScan) -> None:
    for seed in range(60):
        rng = random.Random(seed)
        skip = rng.choice([0, 0, 1])
        pieces = [b"a", b"b", "\u00e9".encode(), b" ", b"{", "\u20ac".encode()]
        values = [None if rng.random() < 0.2 else b"\x01"[:skip] +
                  b"".join(rng.choices(pieces, k=rng.choice([0, 1, 12, 13, rng.randint(0, 3000)])))
                  for _ in range(rng.choice([1, 4, 500]))]
        if skip and seed % 4 == 1:  # a value shorter than its header: the same error
            values[rng.randrange(len(values))] = b""
        rows = cc.split_fields([_tuple([b"x", v]) for v in values], 2)

        def build() -> object:
            try:
                out = cc.string_values(rows, 1, skip)  # noqa: B023
            except DecodeError as exc:
                return f"DecodeError: {exc}"
            out.validate(full=True)
            return out

        on, off = _both(monkeypatch, build)
        if isinstance(on, str):
            assert on == off and "shorter than its 1-byte header" in on, seed
            continue
        assert isinstance(on, pa.StringArray) and isinstance(off, pa.StringArray)
        assert on.equals(off) and on.null_count == off.null_count, seed
        assert on.to_pylist() == [None if v is None else v[skip:].decode() for v in values]


def test_fixed_values_match_numpy(monkeypatch: pytest.MonkeyPatch,
                                  native: copyscan.CopyScan) -> None:
    for seed in range(120):
        rng = random.Random(seed)
        dtype = rng.choice([">i2", ">i4", ">i8", ">u1", ">f4", ">f8"])
        width = np.dtype(dtype).itemsize
        values = [None if rng.random() < 0.2 else rng.randbytes(width)
                  for _ in range(rng.choice([1, 9, 700]))]
        if seed % 5 == 4:  # a value of another width: the same error
            values[rng.randrange(len(values))] = rng.randbytes(rng.choice([0, width + 1]))
        if seed % 7 == 3:  # NaN payloads and infinities travel bit for bit
            values[0] = b"\x7f\xf8\x00\x00\x00\x00\x00\x01"[:width]
        rows = cc.split_fields([_tuple([v, b"x"]) for v in values], 2)

        def gather() -> object:
            try:
                out = cc.fixed_values(rows, 0, dtype)  # noqa: B023
            except DecodeError as exc:
                return f"DecodeError: {exc}"
            return out.dtype, out.tobytes()

        on, off = _both(monkeypatch, gather)
        assert on == off, (seed, dtype)
    got = cc.fixed_values(cc.split_fields([_tuple([struct.pack(">q", -5)]), _tuple([None])],
                                          1), 0, ">i8")
    assert got.tolist() == [-5, 0] and got.dtype == np.dtype("=i8")


def test_decimal_bytes_match_numpy(native: copyscan.CopyScan) -> None:
    from pgcdc_dagster.capture import snapshot_binary as sb
    from pgcdc_dagster.cdc.typeconv.decimal_codec import int64_decimal_bytes

    edges = [0, -1, 1, 127, 128, -128, -129, 2**63 - 1, -(2**63)]
    edges += [s * (2 ** (8 * k - 1)) + d for k in range(1, 8) for s in (1, -1)
              for d in (-1, 0, 1)]
    for seed in range(30):
        rng = random.Random(seed)
        values = edges + [rng.randint(-(2**63), 2**63 - 1) >> rng.randrange(64)
                          for _ in range(rng.choice([0, 10, 2000]))]
        rng.shuffle(values)
        unscaled = np.array(values, dtype=np.int64)
        null = np.array([rng.random() < (0.25 if seed % 2 else 0) for _ in values])
        got = sb._decimal_bytes(native, unscaled, null)
        want = int64_decimal_bytes(unscaled, null)
        assert got.equals(want), seed
        # NULL rows take no bytes, as in the numpy code
        assert np.array_equal(np.frombuffer(got.buffers()[1], np.int32)[:len(values) + 1],
                              np.frombuffer(want.buffers()[1], np.int32)[:len(values) + 1])
        assert got.to_pylist() == [None if z else int(v).to_bytes(
            max(1, (int(v if v >= 0 else ~v).bit_length() + 8) // 8), "big", signed=True)
            for v, z in zip(values, null, strict=True)]
