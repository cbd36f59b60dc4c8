"""Decimal encodings: Kafka Connect Decimal bytes (vectorised) and Java BigDecimal strings.

``org.apache.kafka.connect.data.Decimal`` stores ``BigDecimal.unscaledValue().toByteArray()``:
the unscaled integer as big-endian two's complement in the fewest bytes that keep the sign
(0 -> ``00``, 128 -> ``00 80``, -128 -> ``80``, -129 -> ``ff 7f``). For precision <= 76 the
encoding is vectorised: PostgreSQL's text is cast to an Arrow decimal, the 16- or 32-byte
little-endian words are flipped to big-endian with numpy and the redundant sign bytes are cut.
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def unscaled_bytes(unscaled: int) -> bytes:
    """``BigInteger.toByteArray()``: minimal big-endian two's complement."""
    magnitude = unscaled if unscaled >= 0 else ~unscaled
    return unscaled.to_bytes(magnitude.bit_length() // 8 + 1, "big", signed=True)


def bytes_to_unscaled(data: bytes) -> int:
    """Inverse of :func:`unscaled_bytes`."""
    return int.from_bytes(data, "big", signed=True)


def parse_unscaled(text: str, scale: int) -> int:
    """The unscaled integer of a PostgreSQL numeric text at ``scale`` (exact, any length).

    PostgreSQL prints a NUMERIC(p,s) value with exactly s fraction digits (a multiple of
    10^-s for a negative scale), so no rounding is involved.
    """
    negative = text.startswith("-")
    whole, _, frac = text.lstrip("+-").partition(".")
    if scale >= 0:
        value = int((whole or "0") + frac[:scale].ljust(scale, "0"))
    else:
        value = int(whole or "0") // 10 ** (-scale)
    return -value if negative else value


INT64_DIGITS = 18
"""Decimals of at most this precision have an unscaled value that fits an int64 (the low
word of their decimal128): encoded from it, about five times faster."""


def _int64_bytes(values: pa.Array, buf: pa.Buffer) -> pa.BinaryArray:
    """:func:`decimal_array_to_bytes` of a decimal128 of precision <= 18.

    The byte count is 1 plus the number of 8-bit steps the magnitude (``~v`` for negative
    ``v``) reaches past a sign bit; the bytes are the tail of the big-endian int64.
    """
    n = len(values)
    unscaled = np.frombuffer(buf, dtype=np.int64, count=(values.offset + n) * 2
                             ).reshape(-1, 2)[values.offset:, 0]
    null = np.zeros(n, dtype=bool) if values.null_count == 0 else \
        np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    magnitude = np.where(unscaled < 0, ~unscaled, unscaled)
    lengths = np.ones(n, dtype=np.int32)
    for k in range(1, 8):
        lengths += magnitude >= (1 << (8 * k - 1))
    lengths[null] = 0
    big_endian = unscaled.astype(">i8").view(np.uint8).reshape(n, 8)
    data = big_endian[np.arange(8)[None, :] >= (8 - lengths)[:, None]]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    validity = pa.array(~null, type=pa.bool_()).buffers()[1] if values.null_count else None
    out = pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets),
                                                 pa.py_buffer(data)],
                                null_count=values.null_count)
    assert isinstance(out, pa.BinaryArray)
    return out


def decimal_array_to_bytes(values: pa.Array) -> pa.BinaryArray:
    """Arrow decimal128/decimal256 -> Kafka Connect Decimal bytes, vectorised.

    Args:
        values: A decimal128 or decimal256 array (nulls kept).

    Returns:
        A binary array of minimal big-endian two's-complement unscaled values.
    """
    width = 16 if pa.types.is_decimal128(values.type) else 32
    n = len(values)
    buf = values.buffers()[1]
    assert buf is not None
    if width == 16 and values.type.precision <= INT64_DIGITS:
        return _int64_bytes(values, buf)
    words = np.frombuffer(buf, dtype=np.uint8, count=(values.offset + n) * width,
                          offset=0)[values.offset * width:].reshape(n, width)
    be = words[:, ::-1]
    negative = be[:, 0] >= 0x80
    fill = np.where(negative, 0xFF, 0x00).astype(np.uint8)
    is_fill = be == fill[:, None]
    # length of the leading run of sign-fill bytes
    run = np.where(is_fill.all(axis=1), width, np.argmin(is_fill, axis=1))
    nxt = be[np.arange(n), np.minimum(run, width - 1)]
    keeps_sign = (nxt >= 0x80) == negative
    cut = np.where((run < width) & keeps_sign, run, run - 1)
    cut = np.clip(cut, 0, width - 1)
    lengths = (width - cut).astype(np.int32)
    valid = np.ones(n, dtype=bool) if values.null_count == 0 else \
        np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    lengths = np.where(valid, lengths, 0).astype(np.int32)
    take = (np.arange(width)[None, :] >= cut[:, None]) & valid[:, None]
    data = np.ascontiguousarray(be)[take]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    validity = pa.array(valid, type=pa.bool_()).buffers()[1] if values.null_count else None
    out = pa.Array.from_buffers(pa.binary(), n,
                                [validity, pa.py_buffer(offsets.tobytes()),
                                 pa.py_buffer(data.tobytes())],
                                null_count=values.null_count)
    assert isinstance(out, pa.BinaryArray)
    return out


def text_to_decimal_bytes(text: pa.StringArray, precision: int, scale: int) -> pa.BinaryArray:
    """PostgreSQL numeric text of a NUMERIC(p,s) column -> Decimal bytes at ``scale``."""
    if precision <= 38:
        return decimal_array_to_bytes(pc.cast(text, pa.decimal128(max(precision, 1), scale)))
    if precision <= 76:
        return decimal_array_to_bytes(pc.cast(text, pa.decimal256(precision, scale)))
    out = [None if v is None else unscaled_bytes(parse_unscaled(v, scale))
           for v in text.to_pylist()]
    arr = pa.array(out, type=pa.binary())
    assert isinstance(arr, pa.BinaryArray)
    return arr


def java_bigdecimal_string(value: Decimal) -> str:
    """``BigDecimal.toString()``: plain unless the adjusted exponent is below -6.

    Debezium's ``decimal.handling.mode=string`` writes this form (TYPE-08 context), so
    ``0.00000010`` becomes ``1.0E-7``.
    """
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    coeff = "".join(str(d) for d in digits).lstrip("0") or "0"
    if coeff == "0":
        coeff = "0"
    scale = -exponent
    adjusted = -scale + (len(coeff) - 1)
    prefix = "-" if sign and coeff != "0" else ""
    if scale >= 0 and adjusted >= -6:
        if scale == 0:
            return prefix + coeff
        padded = coeff.rjust(scale + 1, "0")
        return f"{prefix}{padded[:-scale]}.{padded[-scale:]}"
    mantissa = coeff[0] + ("." + coeff[1:] if len(coeff) > 1 else "")
    exp = f"+{adjusted}" if adjusted > 0 else str(adjusted)
    return f"{prefix}{mantissa}E{exp}"


def bytes_to_decimal(values: pa.Array, type_: pa.DataType) -> pa.Array:
    """Kafka Connect Decimal bytes -> Arrow decimal128/decimal256 of ``type_``, vectorised.

    The inverse of :func:`decimal_array_to_bytes`: each big-endian two's-complement value is
    sign-extended to the decimal's width and flipped to little-endian.
    """
    width = 16 if pa.types.is_decimal128(type_) else 32
    n = len(values)
    offset_buf = values.buffers()[1]
    offsets = np.frombuffer(offset_buf, dtype=np.int32)[values.offset:values.offset + n + 1] \
        .astype(np.int64) if n else np.zeros(1, np.int64)
    lengths = np.diff(offsets)
    valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    lengths = np.where(valid, lengths, 0)
    if lengths.max(initial=0) > width:
        raise ValueError(f"a Decimal value is longer than {width} bytes")
    raw = values.buffers()[2]
    data = np.frombuffer(raw, dtype=np.uint8) if raw is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    first = np.where(lengths > 0, data[np.minimum(starts, max(len(data) - 1, 0))]
                     if len(data) else 0, 0)
    fill = np.where((lengths > 0) & (first >= 0x80), 0xFF, 0x00).astype(np.uint8)
    matrix = np.repeat(fill[:, None], width, axis=1)
    rows = np.repeat(np.arange(n), lengths)
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    cols = width - np.repeat(lengths, lengths) + within
    matrix[rows, cols] = data[np.repeat(starts, lengths) + within]
    little = np.ascontiguousarray(matrix[:, ::-1])
    validity = pa.array(valid, type=pa.bool_()).buffers()[1] if values.null_count else None
    return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(little.tobytes())],
                                 null_count=values.null_count)


def plain_decimal(value: Decimal) -> str:
    """A decimal in plain notation with trailing fractional zeros stripped (``12.34``,
    ``100``, ``0``): the silver text of an unconstrained NUMERIC."""
    if not value.is_finite():
        return "NaN" if value.is_nan() else ("Infinity" if value > 0 else "-Infinity")
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    text = "".join(str(d) for d in digits)
    if exponent >= 0:
        body = (text + "0" * exponent).lstrip("0") or "0"
    else:
        padded = text.rjust(-exponent + 1, "0")
        whole, frac = padded[:exponent], padded[exponent:].rstrip("0")
        body = (whole.lstrip("0") or "0") + ("." + frac if frac else "")
    return ("-" if sign and body != "0" else "") + body
