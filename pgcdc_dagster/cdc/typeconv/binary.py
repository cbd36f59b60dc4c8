"""BYTEA under ``binary.handling.mode``, BIT / BIT VARYING, and opaque unknown types.

- BYTEA (TYPE-10, CFG-43): ``bytes`` -> BYTES; ``base64`` / ``base64-url-safe`` / ``hex`` ->
  STRING of that encoding of the octets (Java's encoders: padded base64, lower-case hex).
  The text input is PostgreSQL's ``bytea_output`` (``\\x...`` hex, or the escape format).
  Silver: ``binary``.
- BIT(1) and BIT VARYING(1) -> BOOLEAN. BIT(n>1) / BIT VARYING[(n)] -> BYTES
  ``io.debezium.data.Bits`` with parameter ``length`` = n (2147483647 when unbounded); bits in
  little-endian order (the last character of the text is bit 0), sized by content (up to
  the highest set bit; Java's ``BitSet.toByteArray``), BIT(n) too, as Debezium 3.6 writes
  them (seed 002's padding to n/8 rounded up bytes is older). Silver: the ``0``/``1`` text
  (boolean for one bit), decoded from bronze: BIT(n) exactly (padded to n); BIT VARYING
  without its leading zeros (Debezium does not keep the value's length).
- Unknown types with ``include.unknown.datatypes=true`` (TYPE-12): the UTF-8 octets of the text
  form, encoded per ``binary.handling.mode``. Silver: the text.
"""

from __future__ import annotations

import base64

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.typeconv.base import BaseConverter, map_values
from pgcdc_dagster.cdc.typeconv.model import PgType, TypeModes
from pgcdc_dagster.cdc.typeconv.schema import ConnectSchema, primitive

BITS_NAME = "io.debezium.data.Bits"
UNBOUNDED_BITS = 2**31 - 1


def decode_bytea(text: str) -> bytes:
    """PostgreSQL bytea text output (hex ``\\x..`` or escape format) -> octets."""
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if text[i + 1] == "\\":
                out.append(0x5C)
                i += 2
                continue
            out.append(int(text[i + 1:i + 4], 8))
            i += 4
            continue
        out.extend(ch.encode("utf-8"))
        i += 1
    return bytes(out)


def encode_binary(data: bytes, mode: str) -> bytes | str:
    """Octets in ``binary.handling.mode`` form."""
    if mode == "bytes":
        return data
    if mode == "base64":
        return base64.b64encode(data).decode("ascii")
    if mode == "base64-url-safe":
        return base64.urlsafe_b64encode(data).decode("ascii")
    return data.hex()


def decode_binary(text: str, mode: str) -> bytes:
    """Inverse of :func:`encode_binary` for the string modes."""
    if mode == "base64":
        return base64.b64decode(text)
    if mode == "base64-url-safe":
        return base64.urlsafe_b64decode(text)
    return bytes.fromhex(text)


def binary_schema(mode: str) -> ConnectSchema:
    """BYTES for ``bytes`` mode, STRING otherwise (``BinaryHandlingMode.getSchema``)."""
    return primitive("bytes") if mode == "bytes" else primitive("string")


class ByteaConverter(BaseConverter):
    """BYTEA -> BYTES or an encoded STRING; placeholder: the placeholder octets/string."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        self.mode = modes.binary
        super().__init__(column, pgtype, typmod, modes, nullable, binary_schema(self.mode),
                         pa.binary())

    def _octets(self, text: pa.StringArray) -> pa.Array:
        return map_values(text, decode_bytea, pa.binary())

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        if self.mode == "bytes":
            return self._octets(text)
        return map_values(text, lambda v: encode_binary(decode_bytea(v), self.mode),
                          pa.string())

    def _silver(self, text: pa.StringArray) -> pa.Array:
        return self._octets(text)

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        if self.mode == "bytes":
            return values
        return pa.array([None if v is None else decode_binary(v, self.mode)
                         for v in values.to_pylist()], type=pa.binary())

    def bronze_placeholder(self) -> pa.Scalar | None:
        """Placeholder octets in ``bytes`` mode, the placeholder string otherwise."""
        if self.mode == "bytes":
            return pa.scalar(self.modes.placeholder_bytes, type=pa.binary())
        return self._string_placeholder()


def bits_to_bytes(text: str, size: int | None) -> bytes:
    """``'101'`` -> little-endian octets, bit 0 = last character.

    Args:
        text: The bit string as PostgreSQL prints it.
        size: Octets to pad to (BIT(n)); None sizes by content (BIT VARYING).
    """
    value = int(text, 2) if text else 0
    length = (value.bit_length() + 7) // 8
    if size is not None:
        length = max(length, size)
    return value.to_bytes(length, "little")


class BitsConverter(BaseConverter):
    """BIT(n) / BIT VARYING(n): BOOLEAN for one bit, else io.debezium.data.Bits."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        varying = pgtype.name == "varbit"
        self.length = typmod if typmod > 0 else (UNBOUNDED_BITS if varying else 1)
        self.single = self.length == 1
        self.varying = varying
        if self.single:
            schema, silver = primitive("boolean"), pa.bool_()
        else:
            schema = primitive("bytes", BITS_NAME, parameters=(("length", str(self.length)),))
            silver = pa.string()
        super().__init__(column, pgtype, typmod, modes, nullable, schema, silver)

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        if self.single:
            return pc.equal(text, "1")
        # Sized by content, BIT(n) too (Java's BitSet.toByteArray, as Debezium 3.6 writes).
        return map_values(text, lambda v: bits_to_bytes(v, None), pa.binary())

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        if self.single:
            return values
        return pa.array([None if v is None else self._bit_string(v) for v in values.to_pylist()],
                        type=pa.string())

    def _bit_string(self, data: bytes) -> str:
        value = int.from_bytes(data, "little")
        if not self.varying:
            return format(value, f"0{self.length}b")
        return format(value, "b") if value else ""


class OpaqueConverter(BaseConverter):
    """An unknown type kept opaque (``include.unknown.datatypes=true``, TYPE-12)."""

    def __init__(self, column: str, pgtype: PgType, typmod: int, modes: TypeModes,
                 nullable: bool) -> None:
        self.mode = modes.binary
        super().__init__(column, pgtype, typmod, modes, nullable, binary_schema(self.mode),
                         pa.string())

    def _bronze(self, text: pa.StringArray) -> pa.Array:
        if self.mode == "bytes":
            return pc.cast(text, pa.binary())
        return map_values(text, lambda v: encode_binary(v.encode("utf-8"), self.mode),
                          pa.string())

    def _from_bronze(self, values: pa.Array) -> pa.Array:
        if self.mode == "bytes":
            return pc.cast(values, pa.string())
        return pa.array([None if v is None else decode_binary(v, self.mode).decode("utf-8")
                         for v in values.to_pylist()], type=pa.string())

    def bronze_placeholder(self) -> pa.Scalar | None:
        """Placeholder octets in ``bytes`` mode, the placeholder string otherwise."""
        if self.mode == "bytes":
            return pa.scalar(self.modes.placeholder_bytes, type=pa.binary())
        return self._string_placeholder()
