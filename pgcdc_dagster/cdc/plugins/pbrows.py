"""decoderbufs change rows read by learnt layouts: the fast path of :mod:`.decoderbufs`.

decoderbufs serializes with protobuf-c, which writes fields in field-number order: a change
``RowMessage`` is 1 transaction_id, 2 commit_time, 3 table, 4 op, the ``DatumMessage``\\ s of
5 new_tuple and 6 old_tuple, then 7 new_typeinfo; a datum is 1 column_name, 2 column_type and
at most one value field. Rows of one table and operation repeat the same bytes apart from
the ids, the times and the values. When the protobuf runtime has read such a row,
:func:`learn` turns its shape (table, operation, every datum's name and type, in order) into
one regular expression; later rows of that shape are matched with it (C speed) and only the
values are handled in Python. Each datum's length and each string's length are checked
against what was matched, so a row is taken only when this reading is exactly the protobuf
one; any other row (another shape, a ``Point``, an unchanged TOAST value, a length that does
not add up) gives None and is read by the protobuf runtime, the reference
(``tests/unit/test_plugin_fast_paths.py`` compares both on generated rows).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgcdc_dagster.cdc.changes import Value as RowValue
from pgcdc_dagster.cdc.plugins.pgwire import Value

Values = list[RowValue | object]
"""A tuple's values in datum order: text output as bytes, None (NULL) or MISSING."""
Text = Callable[[int, str, object], Value]
"""Converts a value decoderbufs sent typed: :func:`~.decoderbufs.typed_text`."""

_VARINT = rb"[\x80-\xff]{0,9}[\x00-\x7f]"


def _value(follows: bytes) -> bytes:
    """A datum's value field, if any, as one group. A string or bytes value extends to the
    first place where what ``follows`` it matches, and no further (an atomic group: matching
    stays linear; a value holding such bytes fails the length checks, and the row is read by
    the protobuf runtime)."""
    return (rb"([\x18\x20\x38\x58]" + _VARINT  # int32, int64, bool, missing
            + rb"|\x2d.{4}|\x31.{8}"  # float, double
            + rb"|(?>[\x42\x4a]" + _VARINT + rb".*?(?=" + follows + rb")))?")  # string, bytes


_HEAD = re.compile(rb"\x08" + _VARINT + rb"\x10" + _VARINT + rb"\x1a([\x00-\x7f])", re.S)
_KINDS = {0x18: "datum_int32", 0x20: "datum_int64", 0x38: "datum_bool",
          0x58: "datum_missing", 0x2D: "datum_float", 0x31: "datum_double",
          0x4A: "datum_bytes"}
_F32 = struct.Struct("<f").unpack_from
_F64 = struct.Struct("<d").unpack_from


class _Irregular(Exception):
    """The matched bytes are not a protobuf reading of the row."""


def varint(value: int) -> bytes:
    """Protobuf varint of a non-negative value (or a negative one as 64-bit)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _unvarint(data: bytes, p: int) -> int:
    """The varint at ``data[p:]`` (which the layout matched as exactly one)."""
    result = shift = 0
    for b in data[p:]:
        result |= (b & 0x7F) << shift
        shift += 7
    return result


_FORMATTED_INTS = frozenset({1082, 1083, 1114, 1184, 790})
"""Types whose integer values ``typed_text`` formats (date, time, timestamp, timestamptz,
money); any other integer is its decimal digits."""


def _field_value(oid: int, field: bytes, text: Text) -> RowValue | object:
    """One matched value field (tag and payload) as text output."""
    tag = field[0]
    if tag == 0x42:  # datum_string: the text output itself
        n = field[1]
        if n < 0x80:
            if n != len(field) - 2:
                raise _Irregular
            return field[2:]
        return _sized(field)
    kind = _KINDS[tag]
    v: object
    if tag == 0x4A:
        v = _sized(field)
    elif tag == 0x2D:
        v = _F32(field, 1)[0]
    elif tag == 0x31:
        v = _F64(field, 1)[0]
    else:
        raw = _unvarint(field, 1)
        v = (raw != 0) if tag == 0x38 or tag == 0x58 else \
            raw - (1 << 64) if raw >= 1 << 63 else raw
    converted = text(oid, kind, v)
    return converted.encode() if isinstance(converted, str) else converted


def _sized(field: bytes) -> bytes:
    """The payload of a length-delimited field whose length varint must fit exactly."""
    p = 1
    while field[p] >= 0x80:
        p += 1
    p += 1
    if _unvarint(field[:p], 1) != len(field) - p:
        raise _Irregular
    return field[p:]


@dataclass
class Layout:
    """One shape of change row: matched whole, then its values read per datum."""

    match: Callable[[bytes], re.Match[bytes] | None]
    new: list[tuple[int, int, dict[bytes, RowValue | object]]]
    """(type oid, bytes of the datum before its value field, value field -> text of the
    values converted so far) per new datum, in order."""
    old: list[tuple[int, int, dict[bytes, RowValue | object]]]
    """Likewise per old datum."""

    def read(self, data: bytes, text: Text) -> tuple[Values, Values] | None:
        """(new values, old values) of a row of this shape; None if it is not one."""
        m = self.match(data)
        if m is None:
            return None
        groups = m.groups()
        try:
            new = _values(groups, 0, self.new, text)
            old = _values(groups, 2 * len(self.new), self.old, text) if self.old else []
        except _Irregular:
            return None
        return new, old


def typeinfo_at(data: bytes) -> int | None:
    """Where the ``new_typeinfo`` fields of a serialized RowMessage start (its length if it
    has none); None if the message is not in field-number order or has other fields there."""
    p, size, start = 0, len(data), None
    while p < size:
        tag = data[p]
        if tag == 0x3A and start is None:
            start = p
        elif (start is not None and tag != 0x3A) or tag >> 3 > 7:
            return None
        p += 1
        if tag & 7 == 0:
            while data[p] >= 0x80:
                p += 1
            p += 1
        elif tag & 7 == 2:
            q = p
            while data[q] >= 0x80:
                q += 1
            p = q + 1 + _unvarint(data[p:q + 1], 0)
        else:
            return None
    return None if p != size else size if start is None else start


_MEMO = 256


def _values(groups: tuple[bytes, ...], at: int,
            shape: list[tuple[int, int, dict[bytes, RowValue | object]]], text: Text) -> Values:
    out: Values = []
    append = out.append
    stop = at + 2 * len(shape)
    for (oid, fixed, memo), size, value in zip(shape, groups[at:stop:2],
                                               groups[at + 1:stop:2], strict=True):
        n = size[0] if len(size) == 1 else _unvarint(size, 0)
        if value is None:  # no value field: NULL
            if n != fixed:
                raise _Irregular
            append(None)
            continue
        length = len(value)
        if n != fixed + length:
            raise _Irregular
        tag = value[0]
        if tag == 0x42 and value[1] == length - 2 < 0x80:  # a short string: as it is
            append(value[2:])
        elif (tag == 0x18 or tag == 0x20) and oid not in _FORMATTED_INTS:
            raw = _unvarint(value, 1)
            append(b"%d" % (raw - (1 << 64) if raw >= 1 << 63 else raw))
        elif tag == 0x58:  # datum_missing: rare, left to the protobuf runtime
            raise _Irregular
        else:  # timestamps of one transaction, flags...: converted once
            known = memo.get(value)
            if known is None:
                known = _field_value(oid, value, text)
                if len(memo) >= _MEMO:
                    memo.clear()
                memo[value] = known
            append(known)
    return out


def head(data: bytes) -> tuple[bytes, int] | None:
    """(table as sent, op) of a change row, read cheaply to pick a layout; None if the row
    does not start like one (a BEGIN / COMMIT row, or another layout)."""
    m = _HEAD.match(data)
    if m is None:
        return None
    end = m.end()
    table_end = end + m.group(1)[0]
    if data[table_end:table_end + 1] != b"\x20" or table_end + 1 >= len(data):
        return None
    return data[end:table_end], data[table_end + 1]


def learn(table: bytes, op: int, new: list[tuple[str, int]], old: list[tuple[str, int]],
          tail: bytes) -> Layout:
    """The layout of change rows of ``table`` and ``op`` whose datums are ``new`` / ``old``
    ((column name as sent, type oid), in order), followed by the type descriptions
    ``tail`` (the same bytes for every row of a table and shape)."""

    heads: list[bytes] = []
    shape: list[Any] = []
    for tag, items in ((b"\x2a", new), (b"\x32", old)):
        for name, oid in items:
            raw = name.encode()
            prefix = b"\x0a" + varint(len(raw)) + raw + b"\x10" + varint(oid)
            heads.append(re.escape(tag) + b"(" + _VARINT + b")" + re.escape(prefix))
            shape.append((oid, len(prefix), {}))
    ends = [head.replace(b"(", b"(?:", 1) for head in heads[1:]] + [re.escape(tail) + rb"\Z"]
    pattern = (rb"\x08" + _VARINT + rb"\x10" + _VARINT + b"\x1a"
               + re.escape(varint(len(table)) + table) + b"\x20" + re.escape(varint(op))
               + b"".join(head + _value(end) for head, end in zip(heads, ends, strict=True))
               + re.escape(tail))
    new_shape, old_shape = shape[:len(new)], shape[len(new):]
    return Layout(re.compile(pattern, re.S).fullmatch, new_shape, old_shape)
