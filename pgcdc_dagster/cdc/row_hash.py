"""64-bit hashes of Arrow values, computed column by column (numpy, no per-row Python).

The consistency check (:mod:`pgcdc_dagster.ops.consistency`) sums a hash of every row and of
every key on both sides of a comparison. Both sides are cast to the same Arrow schema first,
so the hash must depend on the values only, never on how an array happens to be laid out:
a slice (non-zero offset), a chunk boundary, ``string`` against ``large_string`` or
``string_view``, a dictionary-encoded column, bytes hidden under a null slot, or the payload
of a NaN all hash alike. What Python's ``repr`` tells apart stays apart: ``-0.0`` and
``0.0``, NULL and an empty string, an empty list and a NULL list, a NULL struct and a struct
of NULLs.

* fixed-width values (integers, booleans, dates, times, timestamps, durations, decimals of
  any width, intervals, fixed-size binary): their bytes, word by word;
* floats: their bit pattern, every NaN as one;
* strings and binaries: a sum over their bytes of a mix of (position, byte), then mixed with
  the length: order matters and the bytes are read in bounded slices, so a value of any
  size hashes in bounded memory;
* lists, maps, fixed-size lists: the same over their elements' hashes; structs: their
  fields' hashes combined in order;
* anything else (extension types, unions, run-end encoded, list views): the exact slow path,
  ``blake2b(repr(value))`` per value, as the check hashed every value before.

The mixer is splitmix64's finaliser. The hashes are stable across processes and versions
(they do not depend on a seed chosen at start-up), but a checksum is only ever compared with
one computed by the same code. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

Hashes = npt.NDArray[np.uint64]

_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
NULL_HASH = np.uint64(0x6E756C6C5F6E756C)
"""The hash of a NULL value (of any type)."""
_NAN_BITS = np.uint64(0x7FF8000000000000)
_ROW_SEED = np.uint64(0x726F775F73656564)
_BYTE_SEED = np.uint64(0x627974655F736565)
_LEN_SEED = np.uint64(0x6C656E5F73656564)
_SLICE = 1 << 20
"""Bytes (or list elements) hashed per step: bounds the temporaries of a long value."""
_MASK = (1 << 64) - 1


def mix(x: Hashes) -> Hashes:
    """splitmix64's finaliser, in place on a fresh array (uint64 arithmetic wraps)."""
    x ^= x >> np.uint64(30)
    x *= _C1
    x ^= x >> np.uint64(27)
    x *= _C2
    x ^= x >> np.uint64(31)
    return x


def combine(hashes: Sequence[Hashes], length: int) -> Hashes:
    """One hash per row of several columns' hashes, order-sensitive."""
    out = np.full(length, _ROW_SEED, dtype=np.uint64)
    for h in hashes:
        out = mix(out * _GOLDEN + h)
    return out


def checksum(hashes: Hashes) -> int:
    """Order-independent sum of hashes, modulo 2^64."""
    return int(hashes.sum(dtype=np.uint64)) & _MASK


def row_hashes(columns: Sequence[pa.Array | pa.ChunkedArray]) -> Hashes:
    """One hash per row of the columns (all of one length)."""
    length = len(columns[0]) if columns else 0
    return combine([column_hashes(c) for c in columns], length)


def exact_hash(value: object) -> int:
    """The slow, exact hash of one Python value (``repr``, blake2b)."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(),
                          "little")


def column_hashes(data: pa.Array | pa.ChunkedArray) -> Hashes:
    """One hash per value of ``data`` (NULL values: :data:`NULL_HASH`)."""
    if isinstance(data, pa.ChunkedArray):
        if data.num_chunks == 1:
            return column_hashes(data.chunk(0))
        parts = [column_hashes(c) for c in data.chunks]
        return np.concatenate(parts) if parts else np.empty(0, np.uint64)
    n = len(data)
    typ = data.type
    if n == 0:
        return np.empty(0, np.uint64)
    if pa.types.is_null(typ):
        return np.full(n, NULL_HASH, np.uint64)
    if pa.types.is_dictionary(typ):
        values = column_hashes(data.dictionary)
        indices = pc.fill_null(data.indices, 0).to_numpy(zero_copy_only=False)
        return _with_nulls(data, values[indices] if len(values) else
                           np.zeros(n, np.uint64))
    if pa.types.is_string_view(typ) or pa.types.is_binary_view(typ):
        target = pa.large_string() if pa.types.is_string_view(typ) else pa.large_binary()
        return column_hashes(data.cast(target))
    if (pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ)
            or pa.types.is_large_binary(typ)):
        return _with_nulls(data, _bytes_hashes(data))
    if pa.types.is_boolean(typ):
        bits = np.unpackbits(np.frombuffer(data.buffers()[1], np.uint8),
                             bitorder="little")[data.offset:data.offset + n]
        return _with_nulls(data, mix(bits.astype(np.uint64) + _GOLDEN))
    if pa.types.is_floating(typ):
        return _with_nulls(data, _float_hashes(data))
    if pa.types.is_struct(typ):
        fields = [column_hashes(data.field(i)) for i in range(typ.num_fields)]
        return _with_nulls(data, combine(fields, n))
    if (pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_map(typ)
            or pa.types.is_fixed_size_list(typ)):
        return _with_nulls(data, _list_hashes(data))
    if _fixed_width(typ):
        return _with_nulls(data, _fixed_hashes(data))
    return np.fromiter((exact_hash(v) for v in data.to_pylist()), np.uint64, count=n)


def _fixed_width(typ: pa.DataType) -> bool:
    if isinstance(typ, pa.ExtensionType):
        return False
    try:
        width = typ.bit_width
    except ValueError:
        return False
    return bool(width % 8 == 0 and width > 0) and (
        pa.types.is_integer(typ) or pa.types.is_temporal(typ) or pa.types.is_decimal(typ)
        or pa.types.is_interval(typ) or pa.types.is_fixed_size_binary(typ))


def _with_nulls(data: pa.Array, hashes: Hashes) -> Hashes:
    if data.null_count:
        hashes[~pc.is_valid(data).to_numpy(zero_copy_only=False)] = NULL_HASH
    return hashes


def _fixed_hashes(data: pa.Array) -> Hashes:
    """Values of any fixed byte width: their bytes as little-endian 64-bit words."""
    width = data.type.bit_width // 8
    n = len(data)
    raw = np.frombuffer(data.buffers()[1], np.uint8)[data.offset * width:
                                                     (data.offset + n) * width]
    if width in (1, 2, 4, 8):
        words = raw.view(f"<u{width}").astype(np.uint64)
        return mix(words + _GOLDEN)
    padded = -width % 8
    cells = raw.reshape(n, width)
    if padded:
        cells = np.concatenate([cells, np.zeros((n, padded), np.uint8)], axis=1)
    words = np.ascontiguousarray(cells).view("<u8")
    return combine([words[:, i].copy() for i in range(words.shape[1])], n)


def _float_hashes(data: pa.Array) -> Hashes:
    """Bit patterns (``-0.0`` is not ``0.0``), every NaN as one."""
    width = data.type.bit_width // 8
    kind = {2: np.float16, 4: np.float32, 8: np.float64}[width]
    n = len(data)
    values = np.frombuffer(data.buffers()[1], kind)[data.offset:data.offset + n]
    bits = values.view(f"<u{width}").astype(np.uint64)
    bits[np.isnan(values)] = _NAN_BITS
    return mix(bits + _GOLDEN)


def _bytes_hashes(data: pa.Array) -> Hashes:
    large = pa.types.is_large_string(data.type) or pa.types.is_large_binary(data.type)
    n = len(data)
    offsets = np.frombuffer(data.buffers()[1], np.int64 if large else np.int32)[
        data.offset:data.offset + n + 1].astype(np.int64)
    buffer = data.buffers()[2]
    content = np.frombuffer(buffer, np.uint8) if buffer is not None else \
        np.empty(0, np.uint8)
    return _segment_hashes(offsets, lambda a, b: content[a:b].astype(np.uint64) + _BYTE_SEED)


def _list_hashes(data: pa.Array) -> Hashes:
    n = len(data)
    if pa.types.is_fixed_size_list(data.type):
        size = data.type.list_size
        offsets = (np.arange(n + 1, dtype=np.int64) + data.offset) * size
    else:
        offsets = data.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    elements = column_hashes(data.values)
    return _segment_hashes(offsets, lambda a, b: elements[a:b])


def _segment_hashes(offsets: npt.NDArray[np.int64],
                    items: Callable[[int, int], Hashes]) -> Hashes:
    """Per segment ``[offsets[i], offsets[i+1])`` of a sequence of item hashes: the sum of
    mix(item + position * golden), then mixed with the segment's length. ``items(a, b)``
    gives the items' uint64 values of positions ``a`` to ``b`` (a slice at a time)."""
    n = len(offsets) - 1
    sums = np.zeros(n, np.uint64)
    low, high = int(offsets[0]), int(offsets[-1])
    for start in range(low, high, _SLICE):
        stop = min(start + _SLICE, high)
        positions = np.arange(start, stop, dtype=np.int64)
        owner = np.searchsorted(offsets, positions, side="right") - 1
        within = (positions - offsets[owner]).astype(np.uint64)
        contrib = mix(items(start, stop) + within * _GOLDEN)
        firsts = np.flatnonzero(np.diff(owner)) + 1
        firsts = np.concatenate([np.zeros(1, np.int64), firsts])
        sums[owner[firsts]] += np.add.reduceat(contrib, firsts)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.uint64)
    return mix(sums + mix(lengths + _LEN_SEED))
