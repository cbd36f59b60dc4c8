"""Protobuf wire-format builders for decoderbufs fixtures (the tests' own, not the parser)."""

from __future__ import annotations


def key(number: int, wire: int) -> bytes:
    """A field key: field number and wire type (0 varint, 1 fixed64, 2 length, 5 fixed32)."""
    return bytes([number << 3 | wire])


def varint(value: int) -> bytes:
    """A varint; a negative value as its 64-bit two's complement."""
    value &= (1 << 64) - 1
    out = b""
    while value >= 0x80:
        out += bytes([value & 0x7F | 0x80])
        value >>= 7
    return out + bytes([value])


def ld(number: int, data: bytes) -> bytes:
    """A length-delimited field."""
    return key(number, 2) + varint(len(data)) + data
