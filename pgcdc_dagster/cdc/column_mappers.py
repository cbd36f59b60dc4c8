"""Debezium's column mappers as converter wrappers: mask, hash, truncate, propagate source type.

A :class:`MappedConverter` wraps a column's converter and changes what bronze (and so silver
and the Debezium JSON export) holds for it, the way Debezium's ``ColumnMapper`` changes the
Connect value and the field schema after the type conversion (seed-inventory TYPE-13..15,
CFG-46..48; the hash masks are not in the seeds and follow Debezium's ``MaskStrings``):

* :class:`Mask` (``column.mask.with.N.chars``): every value, NULL included, becomes N ``*``;
  the field is a STRING with parameter ``masked=true``.
* :class:`Hash` (``column.mask.hash[.v2].<algorithm>.with.salt.<salt>``): the lower-case hex
  digest of ``salt`` followed by the value's octets; v1 hashes the value as Java serialises a
  ``String`` (``ObjectOutputStream``: ``AC ED 00 05 74 <u16 length> <modified UTF-8>``), v2 its
  UTF-8 bytes. NULL stays NULL. For a ``char(n)``/``varchar(n)`` column the digest is cut to n
  characters. The field is a STRING with ``masked=true``.
* :class:`Truncate` (``column.truncate.to.N.chars``): character values longer than N UTF-16
  code units are cut to N; the field keeps its schema plus ``truncateLength=N`` when the
  column's declared length is unknown or greater than N.
* :class:`Propagate` (``column.propagate.source.type``): the field schema gets
  ``__debezium.source.column.type`` (upper-case type name), ``...length`` and ``...scale``,
  computed as PgJDBC's ``TypeInfoCache`` computes column size and decimal digits.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.debezium_json import schema_from_json
from pgcdc_dagster.cdc.typeconv import ColumnConverter, ConnectSchema, PgType

UNKNOWN_LENGTH = 2147483647
"""PgJDBC's ``unknownLength``: the size of unbounded types."""

CHARACTER_TYPES = frozenset({"text", "varchar", "bpchar", "char", "name", "citext"})
"""Types whose values Debezium treats as character data (JDBC CHAR/VARCHAR family)."""

JAVA_DIGESTS: dict[str, str] = {
    "MD5": "md5", "SHA-1": "sha1", "SHA": "sha1", "SHA-224": "sha224", "SHA-256": "sha256",
    "SHA-384": "sha384", "SHA-512": "sha512", "SHA-512/224": "sha512_224",
    "SHA-512/256": "sha512_256", "SHA3-224": "sha3_224", "SHA3-256": "sha3_256",
    "SHA3-384": "sha3_384", "SHA3-512": "sha3_512",
}
"""Java ``MessageDigest`` standard names (case-insensitive) -> ``hashlib`` names."""


@dataclass(frozen=True, slots=True)
class Mask:
    """``column.mask.with.<chars>.chars``."""

    chars: int

    @property
    def text(self) -> str:
        return "*" * self.chars


@dataclass(frozen=True, slots=True)
class Hash:
    """``column.mask.hash[.v2].<algorithm>.with.salt.<salt>``."""

    algorithm: str
    salt: str
    v2: bool = False


@dataclass(frozen=True, slots=True)
class Truncate:
    """``column.truncate.to.<chars>.chars``."""

    chars: int


@dataclass(frozen=True, slots=True)
class Propagate:
    """``column.propagate.source.type``."""


Mapper = Mask | Hash | Truncate | Propagate


def digest_name(algorithm: str) -> str:
    """The ``hashlib`` name of a Java digest name; KeyError when unsupported."""
    return JAVA_DIGESTS[algorithm.upper()]


def _modified_utf8(text: str) -> bytes:
    """Java's modified UTF-8: UTF-16 code units, NUL as ``C0 80``, no 4-byte sequences."""
    out = bytearray()
    units = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        c = (units[i] << 8) | units[i + 1]
        if 1 <= c <= 0x7F:
            out.append(c)
        elif c <= 0x7FF:
            out += bytes((0xC0 | (c >> 6), 0x80 | (c & 0x3F)))
        else:
            out += bytes((0xE0 | (c >> 12), 0x80 | ((c >> 6) & 0x3F), 0x80 | (c & 0x3F)))
    return bytes(out)


def java_serialized_string(text: str) -> bytes:
    """``ObjectOutputStream.writeObject(text)`` octets (stream header included)."""
    body = _modified_utf8(text)
    if len(body) <= 0xFFFF:
        return b"\xac\xed\x00\x05\x74" + len(body).to_bytes(2, "big") + body
    return b"\xac\xed\x00\x05\x7c" + len(body).to_bytes(8, "big") + body


def hash_value(value: str, mask: Hash) -> str:
    """Debezium's ``HashValueConverter``: hex digest of salt + the value's octets."""
    digest = hashlib.new(digest_name(mask.algorithm))
    digest.update(mask.salt.encode("utf-8"))
    digest.update(value.encode("utf-8", "surrogatepass") if mask.v2
                  else java_serialized_string(value))
    return digest.hexdigest()


def java_truncate(value: str, chars: int) -> str:
    """``String.substring(0, chars)`` counted in UTF-16 code units, never splitting a
    surrogate pair (Java would leave half of it, which no UTF-8 writer can encode)."""
    if len(value) <= chars and value.isascii():
        return value
    units = 0
    for i, ch in enumerate(value):
        width = 2 if ord(ch) > 0xFFFF else 1
        if units + width > chars:
            return value[:i]
        units += width
    return value


# Column size and scale, as PgJDBC's TypeInfoCache reports them ---------------------------

def _root(pgtype: PgType, typmod: int) -> tuple[PgType, int]:
    """Resolve domains (the innermost declared typmod wins) and array element types."""
    t, mod = pgtype, typmod
    while t.typtype == "d" and t.base is not None:
        if mod < 0:
            mod = t.base_typmod
        t = t.base
    if t.is_array and t.element is not None:
        t = t.element
        while t.typtype == "d" and t.base is not None:
            t = t.base
    return t, mod


def _second_size(mod: int) -> int:
    return {-1: 7, 0: 0, 1: 3}.get(mod, mod + 1)


def _display_size(name: str, mod: int) -> int:
    fixed = {"int2": 6, "int4": 11, "oid": 10, "int8": 20, "float4": 15, "float8": 25,
             "char": 1, "bool": 1, "date": 13, "interval": 49}
    if name in fixed:
        return fixed[name]
    temporal = {"time": 8, "timetz": 14, "timestamp": 22, "timestamptz": 28}
    if name in temporal:
        return temporal[name] + _second_size(mod)
    if name in ("varchar", "bpchar", "varbit"):
        return UNKNOWN_LENGTH if mod == -1 else (mod - 4 if name != "varbit" else mod)
    if name == "numeric":
        if mod == -1:
            return 131089
        precision, scale = ((mod - 4) >> 16) & 0xFFFF, (mod - 4) & 0xFFFF
        return 1 + precision + (1 if scale else 0)
    if name == "bit":
        return mod
    return UNKNOWN_LENGTH


def _precision(name: str, mod: int) -> int:
    fixed = {"int2": 5, "int4": 10, "oid": 10, "int8": 19, "float4": 8, "float8": 17,
             "char": 1, "bool": 1}
    if name in fixed:
        return fixed[name]
    if name == "numeric":
        return 0 if mod == -1 else ((mod - 4) & 0xFFFF0000) >> 16
    if name in ("bpchar", "varchar"):
        return UNKNOWN_LENGTH if mod == -1 else mod - 4
    if name in ("date", "time", "timetz", "interval", "timestamp", "timestamptz"):
        return _display_size(name, mod)
    if name == "bit":
        return mod
    if name == "varbit":
        return UNKNOWN_LENGTH if mod == -1 else mod
    return UNKNOWN_LENGTH


def _scale(name: str, mod: int) -> int:
    if name == "float4":
        return 8
    if name == "float8":
        return 17
    if name == "numeric":
        return 0 if mod == -1 else (mod - 4) & 0xFFFF
    if name in ("time", "timetz", "timestamp", "timestamptz"):
        return 6 if mod == -1 else mod
    if name == "interval":
        return 6 if mod == -1 else mod & 0xFFFF
    return 0


def column_length(pgtype: PgType, typmod: int) -> int:
    """JDBC ``COLUMN_SIZE`` of a column (precision, or display size when that is 0)."""
    root, mod = _root(pgtype, typmod)
    name = root.name if root.schema == "pg_catalog" else ""
    size = _precision(name, mod)
    return size if size != 0 else _display_size(name, mod)


def source_type_parameters(pgtype: PgType, typmod: int) -> tuple[tuple[str, str], ...]:
    """``column.propagate.source.type`` parameters of a column (TYPE-15, CFG-48)."""
    root, mod = _root(pgtype, typmod)
    name = root.name if root.schema == "pg_catalog" else ""
    return (("__debezium.source.column.type", pgtype.name.upper()),
            ("__debezium.source.column.length", str(column_length(pgtype, typmod))),
            ("__debezium.source.column.scale", str(_scale(name, mod))))


def declared_char_length(pgtype: PgType, typmod: int) -> int | None:
    """``n`` of a ``char(n)``/``varchar(n)`` column (domains resolved); None otherwise."""
    root, mod = _root(pgtype, typmod)
    if root.name in ("varchar", "bpchar") and mod >= 4 and not pgtype.is_array:
        return mod - 4
    return None


def is_character(pgtype: PgType) -> bool:
    """True for the character types (domains resolved; arrays are not)."""
    root, _ = _root(pgtype, -1)
    return root.name in CHARACTER_TYPES and not pgtype.is_array


# The wrapper converter -------------------------------------------------------------------

def _schema_of(conv: ColumnConverter) -> ConnectSchema:
    return schema_from_json(conv.connect_schema())


def _with_params(schema: ConnectSchema, extra: tuple[tuple[str, str], ...]) -> ConnectSchema:
    params = dict(schema.parameters)
    params.update(extra)
    return ConnectSchema(schema.type, schema.optional, schema.name, schema.version, schema.doc,
                         tuple(params.items()), schema.fields, schema.items, schema.keys,
                         schema.values)


class MappedConverter:
    """A column converter with one Debezium column mapper applied (see the module doc).

    It satisfies ``ColumnConverter``; ``base`` is the wrapped converter. Picklable, so that
    snapshot chunk tasks can carry it to Spark workers.
    """

    dropped = False

    def __init__(self, base: ColumnConverter, mapper: Mapper, pgtype: PgType,
                 typmod: int) -> None:
        self.base = base
        self.mapper = mapper
        self.character = is_character(pgtype)
        self.char_length = declared_char_length(pgtype, typmod)
        base_schema = _schema_of(base)
        name = base.bronze_field.name
        pg_meta = {k: v for k, v in (base.bronze_field.metadata or {}).items()
                   if k.startswith(b"pg.")}
        self.applies = True
        if isinstance(mapper, Mask | Hash):
            schema = ConnectSchema("string", base_schema.optional,
                                   parameters=(("masked", "true"),))
        elif isinstance(mapper, Truncate):
            length = column_length(pgtype, typmod)
            self.applies = self.character and (length < 0 or length > mapper.chars)
            schema = (_with_params(base_schema, (("truncateLength", str(mapper.chars)),))
                      if self.applies else base_schema)
        else:
            schema = _with_params(base_schema, source_type_parameters(pgtype, typmod))
        self.schema = schema
        meta: dict[bytes | str, bytes | str] = {}
        meta.update(schema.arrow_metadata())
        meta.update(pg_meta)
        self.bronze_field = pa.field(name, schema.arrow_type(), base.bronze_field.nullable,
                                     metadata=meta)
        self.silver_field = (base.silver_field.with_type(pa.string())
                             if isinstance(mapper, Mask | Hash) else base.silver_field)

    def __repr__(self) -> str:
        return f"MappedConverter({self.base!r}, {self.mapper!r})"

    # value mapping -----------------------------------------------------------------

    def _hash(self, value: str) -> str:
        assert isinstance(self.mapper, Hash)
        out = hash_value(value, self.mapper)
        return out[: self.char_length] if self.char_length else out

    def _map_strings(self, values: pa.Array) -> pa.Array:
        """Apply the mapper to converted (bronze) values of the base converter."""
        mapper = self.mapper
        if isinstance(mapper, Mask):
            return pa.array([mapper.text] * len(values), pa.string())
        if isinstance(mapper, Truncate):
            if not self.applies:
                return values
            # UTF-8 bytes >= UTF-16 code units: a superset of the values to cut
            long = pc.greater(pc.binary_length(values), mapper.chars)
            if not pc.any(long).as_py():
                return values
            return pa.array([None if v is None else java_truncate(v, mapper.chars)
                             for v in values.to_pylist()], values.type)
        return values

    def to_bronze(self, text: pa.Array) -> pa.Array:
        """Text values -> the mapped Debezium values."""
        mapper = self.mapper
        if isinstance(mapper, Hash):
            if self.character:
                source = self.base.to_bronze(text)
            else:
                source = text.cast(pa.string()) if text.type != pa.string() else text
                if not self.bronze_field.nullable:
                    source = pc.fill_null(source, "")
            return pa.array([None if v is None else self._hash(v)
                             for v in source.to_pylist()], pa.string())
        if isinstance(mapper, Mask):
            return self._map_strings(text)
        return self._map_strings(self.base.to_bronze(text))

    def to_silver(self, text: pa.Array) -> pa.Array:
        return self.from_bronze(self.to_bronze(text))

    def from_bronze(self, values: pa.Array | pa.ChunkedArray) -> pa.Array:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
        if isinstance(self.mapper, Mask | Hash):
            return values if values.type == pa.string() else values.cast(pa.string())
        return self.base.from_bronze(values)

    def bronze_fallback(self) -> pa.Scalar:
        """Debezium maps the NOT NULL fallback like any value."""
        mapper = self.mapper
        if isinstance(mapper, Mask):
            return pa.scalar(mapper.text, pa.string())
        if isinstance(mapper, Hash):
            return pa.scalar(self._hash(""), pa.string())
        return self.base.bronze_fallback()

    def bronze_placeholder(self) -> pa.Scalar | None:
        """The unchanged-TOAST placeholder, mapped as Debezium maps the placeholder value."""
        mapper = self.mapper
        if isinstance(mapper, Mask):
            return pa.scalar(mapper.text, pa.string())
        base = self.base.bronze_placeholder()
        if base is None or isinstance(mapper, Propagate):
            return base
        value = base.as_py()
        if not isinstance(value, str):
            return None if isinstance(mapper, Hash) else base
        if isinstance(mapper, Hash):
            return pa.scalar(self._hash(value), pa.string())
        return pa.scalar(java_truncate(value, mapper.chars) if self.applies else value,
                         base.type)

    def to_json(self, value: object) -> object:
        return self.schema.json_value(value)

    def connect_schema(self) -> dict[str, Any]:
        return self.schema.json_schema(field=self.bronze_field.name)
