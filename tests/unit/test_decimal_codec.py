"""Kafka Connect Decimal bytes (TYPE-08 precise mode): the vectorised encoders agree with
``BigInteger.toByteArray()`` at every byte-length boundary, signs and NULLs included."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pgcdc_dagster.cdc.typeconv.decimal_codec import (
    bytes_to_unscaled,
    decimal_array_to_bytes,
    unscaled_bytes,
)


def _edges() -> list[int]:
    out = [0, 1, -1, 2**63 - 1, -(2**63)]
    for k in range(1, 8):
        edge = 1 << (8 * k - 1)
        out += [edge - 1, edge, edge + 1, -edge, -edge - 1, -edge + 1]
    return out


def test_decimal128_encoder_matches_java_byte_arrays() -> None:
    values = np.array(_edges(), dtype=np.int64)
    words = np.empty((len(values), 2), dtype=np.int64)
    words[:, 0] = values
    words[:, 1] = np.where(values < 0, -1, 0)
    dec = pa.Array.from_buffers(pa.decimal128(38, 0), len(values), [None, pa.py_buffer(words)])
    got = decimal_array_to_bytes(dec).to_pylist()
    assert got == [unscaled_bytes(int(v)) for v in values]
    assert [bytes_to_unscaled(b) for b in got[:5]] == _edges()[:5]
    assert got[:5] == [b"\x00", b"\x01", b"\xff", b"\x7f" + b"\xff" * 7, b"\x80" + bytes(7)]


def test_int64_encoder_equals_the_general_one_with_nulls_and_offsets() -> None:
    rng = np.random.default_rng(5)
    edges = [v for v in _edges() if abs(v) < 10**18]
    values = np.concatenate([np.array(edges, dtype=np.int64),
                             rng.integers(-(10**18) + 1, 10**18, 5000, dtype=np.int64)])
    null = np.zeros(len(values), dtype=bool)
    null[7::11] = True
    words = np.empty((len(values), 2), dtype=np.int64)
    words[:, 0] = values
    words[:, 1] = np.where(values < 0, -1, 0)
    dec = pa.Array.from_buffers(pa.decimal128(18, 0), len(values),
                                [pa.array(~null).buffers()[1], pa.py_buffer(words)],
                                null_count=int(null.sum()))
    want = [None if n else unscaled_bytes(int(v)) for v, n in zip(values, null, strict=True)]
    assert decimal_array_to_bytes(dec).to_pylist() == want
    assert decimal_array_to_bytes(dec.slice(3, 100)).to_pylist() == want[3:103]
