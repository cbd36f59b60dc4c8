"""Column-wise row hashes (``cdc/row_hash.py``) and the digest built on them
(``ops/digest.py``): what the consistency check sums on both sides.

Identical Arrow values must hash identically however the arrays are laid out (slices,
chunks, string vs large_string vs string_view, dictionaries, bytes under NULL slots, NaN
payloads, values longer than a hashing slice), and values ``repr`` tells apart must hash
apart (-0.0 / 0.0, NULL / '' / [] / a struct of NULLs, a decimal's last digit, the order of
a list or of a string's bytes, an instant's microsecond).
"""

from __future__ import annotations

import struct
from datetime import UTC, date, datetime
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from pgcdc_dagster.cdc import row_hash
from pgcdc_dagster.cdc.row_hash import column_hashes, row_hashes
from pgcdc_dagster.ops.digest import Digest, differences

pytestmark = pytest.mark.unit

INTERVAL = pa.struct([("months", pa.int32()), ("days", pa.int32()),
                      ("microseconds", pa.int64())])
GEOMETRY = pa.struct([("wkb", pa.binary()), ("srid", pa.int32())])
# Every silver type of docs/types.md, with values that differ only slightly.
FAMILIES: dict[str, tuple[pa.DataType, list[object]]] = {
    "boolean": (pa.bool_(), [True, False]),
    "int16": (pa.int16(), [-32768, 32767]),
    "int32": (pa.int32(), [1, -1]),
    "int64": (pa.int64(), [2**63 - 1, -(2**63)]),
    "float32": (pa.float32(), [1.5, float("-inf")]),
    "float64": (pa.float64(), [0.0, -0.0]),
    "string": (pa.string(), ["ab", "ba"]),
    "decimal": (pa.decimal128(10, 2), [Decimal("12.34"), Decimal("12.35")]),
    "decimal38": (pa.decimal128(38, 0), [Decimal(1), Decimal(2**64 + 1)]),  # high word
    "decimal256": (pa.decimal256(50, 2), [Decimal("1.00"), Decimal(f"{2**130 + 1}.00")]),
    "date": (pa.date32(), [date(2018, 6, 20), date(1, 1, 1)]),
    "timestamp_ntz": (pa.timestamp("us"), [datetime(2018, 6, 20, 15, 13, 16, 945104),
                                           datetime(2018, 6, 20, 15, 13, 16, 945105)]),
    "timestamp": (pa.timestamp("us", "UTC"), [datetime(2018, 6, 20, tzinfo=UTC),
                                              datetime(9999, 12, 31, tzinfo=UTC)]),
    "interval": (INTERVAL, [{"months": 1, "days": 2, "microseconds": 3},
                            {"months": 2, "days": 1, "microseconds": 3}]),
    "binary": (pa.binary(), [b"\x00\xff", b"\xff\x00"]),
    "map": (pa.map_(pa.string(), pa.string()), [[("a", "1"), ("b", None)],
                                                [("a", "1"), ("b", "")]]),
    "point": (pa.struct([("x", pa.float64()), ("y", pa.float64())]),
              [{"x": 1.0, "y": 2.0}, {"x": 2.0, "y": 1.0}]),
    "geometry": (GEOMETRY, [{"wkb": b"\x01\x01", "srid": 0}, {"wkb": b"\x01\x01",
                                                               "srid": 4326}]),
    "list<int>": (pa.list_(pa.int32()), [[1, None], [None, 1]]),
    "list<string>": (pa.list_(pa.string()), [["a b", None, ""], ["a b", "", None]]),
    "list<decimal>": (pa.list_(pa.decimal128(5, 2)), [[Decimal("1.50")], [Decimal("1.51")]]),
    "list<struct>": (pa.list_(GEOMETRY), [[None], [{"wkb": None, "srid": None}]]),
    "interval_mdn": (pa.month_day_nano_interval(), [pa.MonthDayNano([1, 2, 3]),
                                                     pa.MonthDayNano([1, 2, 4])]),
    "fixed_binary": (pa.binary(3), [b"abc", b"abd"]),
}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == np.uint64 and b.dtype == np.uint64 and bool((a == b).all())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_tells_values_apart_whatever_the_layout(family: str) -> None:
    typ, (one, two) = FAMILIES[family]
    values = [one, two, None, one, two]
    data = pa.array(values, typ)
    hashes = column_hashes(data)
    assert len(set(hashes[:3].tolist())) == 3, family  # one, two and NULL all differ
    assert hashes[0] == hashes[3] and hashes[1] == hashes[4]
    # the same values at another offset, in chunks, or in a larger array's slice
    longer = pa.array([two, None, *values, one], typ)
    assert _same(column_hashes(longer.slice(2, 5)), hashes)
    assert _same(column_hashes(pa.chunked_array([data.slice(0, 2), data.slice(2)])), hashes)
    # the slow exact path is never taken for these types
    assert not _uses_exact_path(data)


def _uses_exact_path(data: pa.Array) -> bool:
    calls: list[object] = []
    original = row_hash.exact_hash
    row_hash.exact_hash = lambda value: calls.append(value) or 0  # type: ignore[assignment]
    try:
        column_hashes(data)
    finally:
        row_hash.exact_hash = original
    return bool(calls)


def test_string_types_and_encodings_hash_alike() -> None:
    texts = ["", "a", None, "日本語", "tab\tnew\nline", "a" * 100]
    plain = column_hashes(pa.array(texts, pa.string()))
    for other in (pa.array(texts, pa.large_string()), pa.array(texts, pa.string_view()),
                  pa.array(texts, pa.string()).dictionary_encode()):
        assert _same(column_hashes(other), plain), other.type
    as_bytes = column_hashes(pa.array([t.encode() if t is not None else None for t in texts],
                                      pa.large_binary()))
    assert _same(as_bytes, plain)


def test_null_slots_hide_their_bytes_and_nan_payloads_are_one() -> None:
    # A NULL whose offsets still span bytes (Arrow allows it) hashes as any NULL.
    built = pa.Array.from_buffers(pa.string(), 2, [pa.py_buffer(bytes([0b01])),
                                                   pa.py_buffer(np.array([0, 1, 4], np.int32)),
                                                   pa.py_buffer(b"xabc")])
    assert built.to_pylist() == ["x", None]
    assert _same(column_hashes(built), column_hashes(pa.array(["x", None])))
    quiet = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000))[0]
    payload = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000123))[0]
    negative = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000000))[0]
    nans = column_hashes(pa.array([quiet, payload, negative]))
    assert len(set(nans.tolist())) == 1  # repr() says 'nan' for all of them
    signed = column_hashes(pa.array([0.0, -0.0, None], pa.float64()))
    assert len(set(signed.tolist())) == 3  # repr() tells 0.0 from -0.0
    assert column_hashes(pa.array([-0.0], pa.float32()))[0] != \
        column_hashes(pa.array([0.0], pa.float32()))[0]


def test_empty_null_and_nested_nulls_differ() -> None:
    strings = column_hashes(pa.array(["", None]))
    assert strings[0] != strings[1]
    lists = column_hashes(pa.array([[], None, [None], [""]], pa.list_(pa.string())))
    assert len(set(lists.tolist())) == 4
    structs = column_hashes(pa.array([None, {"x": None, "y": None}], FAMILIES["point"][0]))
    assert structs[0] != structs[1]
    # a string's bytes and a list's elements are ordered; ('ab', 'c') is not ('a', 'bc')
    assert len(set(row_hashes([pa.array(["ab", "a"]), pa.array(["c", "bc"])]).tolist())) == 2


def test_values_longer_than_a_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_hash, "_SLICE", 7)  # every value crosses slice boundaries
    texts = ["x" * 30, "y", "", None, "x" * 30, "x" * 29 + "y"]
    small = column_hashes(pa.array(texts))
    assert small[0] == small[4] and len(set(small[[0, 1, 2, 3, 5]].tolist())) == 5
    shifted = column_hashes(pa.array(["zzz", *texts]).slice(1))
    assert _same(shifted, small)
    lists = pa.array([list(range(20)), [1], list(range(20)), [*range(19), 0]],
                     pa.list_(pa.int64()))
    hashed = column_hashes(lists)
    assert hashed[0] == hashed[2] and len(set(hashed.tolist())) == 3
    monkeypatch.setattr(row_hash, "_SLICE", 1 << 20)
    assert _same(column_hashes(pa.array(texts)), small)  # the slice size changes nothing


def test_types_without_a_vectorised_hash_take_the_exact_path() -> None:
    union = pa.UnionArray.from_sparse(pa.array([0, 1, 0], pa.int8()),
                                      [pa.array([1, 2, 3]), pa.array(["a", "b", "c"])])
    hashes = column_hashes(union)
    assert _uses_exact_path(union)
    assert hashes[0] != hashes[2] and _same(column_hashes(union), hashes)


def _table(ids: list[int], values: list[object], typ: pa.DataType) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int32()), "v": pa.array(values, typ)})


def test_digest_names_the_differing_keys_only_when_the_sides_differ() -> None:
    source, silver = Digest(), Digest()
    left_out = np.empty(0, np.uint64)
    source.add(_table([1, 2, 3, 4], ["a", "", None, "d"], pa.string()), [0], left_out, 100)
    silver.add(_table([2, 3, 5], [None, None, "e"], pa.string()), [0], left_out, 100)
    assert (source.rows, silver.rows) == (4, 3)
    found = differences(source, silver)
    assert found.missing == ["(1,)", "(4,)"] and found.extra == ["(5,)"]
    assert found.different == ["(2,)"]  # '' against NULL; (3,) holds NULL on both sides
    same = Digest()
    same.add(_table([4, 3, 2, 1], ["d", None, "", "a"], pa.string()), [0], left_out, 100)
    assert (same.rows, same.key_checksum, same.row_checksum) == \
        (source.rows, source.key_checksum, source.row_checksum)  # order-independent
    assert differences(source, same).missing == []
    # Keys changed after silver's position are left out of either side, by key hash.
    pending = np.unique(row_hashes([pa.array([1, 4], pa.int32())]))
    partial = Digest()
    partial.add(_table([1, 2, 3, 4], ["a", "", None, "d"], pa.string()), [0], pending, 100)
    assert (partial.rows, partial.excluded) == (2, 2)
    # Past keep_limit a side keeps nothing and names nothing, but still counts and sums.
    big = Digest()
    big.add(_table([1, 2, 3, 4], ["a", "", None, "d"], pa.string()), [0], left_out, 3)
    assert big.kept is None and big.row_checksum == source.row_checksum
    assert differences(big, silver).missing == []
