"""Unit tests of the first types: integers, bool, text, numeric (all modes), timestamptz.

Expected values come from the seeds where they give one (seed-inventory TYPE-04..08).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from pgcdc_dagster.cdc.typeconv import PgType, TypeModes, converter_for
from pgcdc_dagster.exceptions import UnsupportedTypeError

pytestmark = pytest.mark.unit


def pg(name: str, typtype: str = "b", category: str = "U") -> PgType:
    return PgType(0, "pg_catalog", name, typtype, category)


def numeric_typmod(p: int, s: int) -> int:
    return ((p << 16) | s) + 4


def conv(name: str, typmod: int = -1, **modes: object):
    return converter_for("c", pg(name), typmod, TypeModes(**modes))  # type: ignore[arg-type]


def test_integers_bool_text():
    assert conv("int2").to_bronze(pa.array(["-32768", "32767", None])).type == pa.int16()
    assert conv("int4").to_bronze(pa.array(["-1", None])).to_pylist() == [-1, None]
    assert conv("int8").to_silver(pa.array(["9223372036854775807"])).to_pylist() == [2**63 - 1]
    assert conv("bool").to_bronze(pa.array(["t", "f", None])).to_pylist() == [True, False, None]
    text = conv("text").to_bronze(pa.array(["日本語", "", None]))
    assert text.to_pylist() == ["日本語", "", None]
    assert conv("varchar").connect_schema() == {"type": "string", "optional": True, "field": "c"}


def test_precise_decimal_is_unscaled_twos_complement_bytes():
    c = conv("numeric", numeric_typmod(10, 2))
    out = c.to_bronze(pa.array(["12.34", "-0.01", "0.00", "1.28", "-1.28", None]))
    assert out.to_pylist() == [b"\x04\xd2", b"\xff", b"\x00", b"\x00\x80", b"\x80", None]
    assert c.connect_schema() == {
        "type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "c"}
    assert c.to_json(b"\x04\xd2") == "BNI="
    assert str(c.to_silver(pa.array(["12.34"])).type) == "decimal128(10, 2)"


def test_variable_scale_decimal_strips_trailing_zeros():
    c = conv("numeric")
    out = c.to_bronze(pa.array(["12.3400", "100", "0.000", "-5.5", None]))
    assert out.to_pylist() == [
        {"scale": 2, "value": b"\x04\xd2"}, {"scale": 0, "value": b"\x64"},
        {"scale": 0, "value": b"\x00"}, {"scale": 1, "value": b"\xc9"}, None]
    assert c.bronze_field.type == pa.struct(
        [pa.field("scale", pa.int32(), False), pa.field("value", pa.binary(), False)])


def test_nan_per_mode():
    """TYPE-08: only string and double can carry NaN; precise fails like Debezium."""
    values = pa.array(["NaN", "Infinity", "-Infinity"])
    assert conv("numeric", decimal="string").to_bronze(values).to_pylist() == [
        "NAN", "POSITIVE_INFINITY", "NEGATIVE_INFINITY"]
    doubles = conv("numeric", decimal="double").to_bronze(values).to_pylist()
    assert doubles[1:] == [float("inf"), float("-inf")] and doubles[0] != doubles[0]
    with pytest.raises(UnsupportedTypeError, match=r"decimal\.handling\.mode"):
        conv("numeric").to_bronze(values)


def test_zoned_timestamp_is_utc_iso():
    """TYPE-07: ZonedTimestamp in GMT with Z; six fraction digits for an unconstrained column."""
    c = conv("timestamptz")
    text = pa.array(["2018-06-20 15:13:16.945104+00", "2018-06-20 17:13:16.5+02", None])
    assert c.to_bronze(text).to_pylist() == [
        "2018-06-20T15:13:16.945104Z", "2018-06-20T15:13:16.500000Z", None]
    assert c.to_silver(text).type == pa.timestamp("us", tz="UTC")


def _python_opcodes(fn: object, values: pa.Array) -> int:
    """Python bytecodes executed (in every Python frame) while ``fn`` runs."""
    import sys
    from types import FrameType

    executed = 0

    def trace(frame: FrameType, event: str, arg: object) -> object:
        nonlocal executed
        frame.f_trace_opcodes = True
        if event == "opcode":
            executed += 1
        return trace

    sys.settrace(trace)  # type: ignore[arg-type]
    try:
        fn(values)  # type: ignore[operator]
    finally:
        sys.settrace(None)
    return executed


def _sample(name: str, n: int) -> pa.Array:
    rows = {
        "int4": lambda i: str(i - n // 2),
        "text": lambda i: f"v{i}",
        "timestamptz": lambda i: f"2024-01-{1 + i % 28:02d} 12:00:{i % 60:02d}.{i % 999999:06d}+00",
        "timestamp": lambda i: f"2024-01-{1 + i % 28:02d} 12:00:00",
        "date": lambda i: f"2024-01-{1 + i % 28:02d}",
    }[name]
    return pa.array([rows(i) for i in range(n)])


@pytest.mark.parametrize("name", ["int4", "text", "timestamptz", "timestamp", "date"])
def test_common_types_are_vectorised(name: str) -> None:
    """The common types convert column-wise: the Python bytecode a conversion executes does
    not grow with the number of rows (counted by a trace hook, not timed, so a busy machine
    cannot flake it). Any per-row Python loop would run ~100x the bytecodes for 100x the rows."""
    c = conv(name)
    for fn in (c.to_bronze, c.to_silver):
        small = _python_opcodes(fn, _sample(name, 1_000))
        large = _python_opcodes(fn, _sample(name, 100_000))
        assert large <= 2 * small + 200, (name, fn, small, large)
