"""decoderbufs rows (Protobuf ``RowMessage``) -> pgoutput protocol-1 messages.

The message layout is decoderbufs' ``proto/pg_logicaldec.proto``; there is no protoc here, so
a small reader walks the wire format (varint and length-delimited fields, 32/64-bit fixed):

- ``RowMessage``: 1 transaction_id (varint), 2 commit_time (varint, µs since the Unix
  epoch), 3 table (string, ``quote_qualified_identifier``), 4 op (varint: 0 INSERT, 1 UPDATE,
  2 DELETE, 3 BEGIN, 4 COMMIT), 5 new_tuple and 6 old_tuple (repeated ``DatumMessage``),
  7 new_typeinfo (ignored: the catalog gives types).
- ``DatumMessage``: 1 column_name (quoted identifier), 2 column_type (oid), then one of
  3 int32, 4 int64, 5 float, 6 double, 7 bool, 8 string, 9 bytes, 10 Point {1 x, 2 y double},
  11 datum_missing (decoderbufs 2.x: an unchanged TOAST value, which decoderbufs does not
  read from disk). A column with no value at all is NULL.

decoderbufs converts some types to numbers instead of their text output; they are written
back as PostgreSQL's text (dates from days, timestamps from µs, ``time`` from µs of day,
``timetz`` from µs in UTC, money from cents, ``bytea`` from its octets, ``point`` from x/y),
so the type converters see what pgoutput sends. ``interval`` arrives as microseconds with
months folded in at 365.25/12 days, exactly Debezium's numeric encoding; it is written as days
and time, so ``interval.handling.mode=string`` cannot be exact with decoderbufs.

decoderbufs sends no LSN of its own and no commit LSN: BEGIN and COMMIT rows carry the xid and
commit time; the peek row of a COMMIT is at the transaction's end LSN. A transaction is
therefore buffered until its COMMIT row, and its commit LSN is taken as ``min(end LSN, window
end) - 1``: inside the commit record, ascending in commit order, and below the window end, so
the exactly-once bookkeeping (``commit LSN < committed window end`` is already stored) holds.
It is not the value pgoutput reports (``docs/plugins.md``). No TRUNCATE and no logical
decoding messages are sent by decoderbufs.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from pgcdc_dagster.cdc.plugins.pgwire import (
    MISSING,
    Value,
    WindowMessages,
    begin,
    commit,
)
from pgcdc_dagster.cdc.typeconv.calendar import civil_from_days
from pgcdc_dagster.exceptions import DecodeError

_INSERT, _UPDATE, _DELETE, _BEGIN, _COMMIT = range(5)
_BYTEA, _DATE, _TIME, _TIMESTAMP, _TIMESTAMPTZ, _TIMETZ, _INTERVAL, _MONEY = (
    17, 1082, 1083, 1114, 1184, 1266, 1186, 790)
_FLOAT4 = 700
_US_PER_DAY = 86_400_000_000


def fields(buf: bytes, pos: int = 0, end: int | None = None) -> Iterator[tuple[int, Any]]:
    """(field number, value) of a Protobuf message: ints for varint and fixed fields
    (fixed ones as raw bytes), ``bytes`` for length-delimited ones.

    Raises:
        DecodeError: a truncated message or an unknown wire type.
    """
    end = len(buf) if end is None else end
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, pos = buf[pos:pos + width], pos + width
        else:
            raise DecodeError(f"decoderbufs: unknown Protobuf wire type {wire} at {pos}")
        if pos > end:
            raise DecodeError("decoderbufs: truncated Protobuf message")
        yield number, value


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise DecodeError("decoderbufs: truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _unquote(name: str) -> str:
    """``quote_identifier`` output back to the name."""
    if len(name) >= 2 and name[0] == '"' and name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return name


def _split_table(text: str) -> tuple[str, str]:
    """``quote_qualified_identifier`` output (``public."My.Table"``) -> (schema, table)."""
    quoted = False
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif ch == "." and not quoted:
            return _unquote(text[:i]), _unquote(text[i + 1:])
    raise DecodeError(f"decoderbufs: table name {text!r:.80} has no schema")


# --- values back to PostgreSQL's text output --------------------------------------------------

def _date(days: int) -> str:
    year, month, day = civil_from_days(days)
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d} BC"
    return f"{year:04d}-{month:02d}-{day:02d}"


def _clock(us: int) -> str:
    secs, frac = divmod(us, 1_000_000)
    text = f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    return text + (f".{frac:06d}".rstrip("0") if frac else "")


def _timestamp(us: int, zone: str = "") -> str:
    days, rest = divmod(us, _US_PER_DAY)
    date = _date(days)
    bc = date.endswith(" BC")
    text = f"{date[:-3] if bc else date} {_clock(rest)}{zone}"
    return text + " BC" if bc else text


def _float(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _money(cents: int) -> str:
    sign, cents = ("-", -cents) if cents < 0 else ("", cents)
    return f"{sign}${cents // 100:,}.{cents % 100:02d}"


def _interval(us: float) -> str:
    days, rest = divmod(round(us), _US_PER_DAY)
    return f"{days} days {_clock(rest)}" if days else _clock(rest)


def _datum(buf: bytes) -> tuple[str, Value]:
    name, oid, value = "", 0, None  # type: tuple[str, int, Value]
    fast = _simple_datum(buf)
    if fast is not None:
        return fast
    for number, raw in fields(buf):
        if number == 1:
            name = _unquote(raw.decode())
        elif number == 2:
            oid = raw
        elif number == 3:
            v = _signed(raw, 64)
            value = _date(v) if oid == _DATE else str(v)
        elif number == 4:
            v = _signed(raw, 64)
            value = (_timestamp(v) if oid == _TIMESTAMP else
                     _timestamp(v, "+00") if oid == _TIMESTAMPTZ else
                     _clock(v) if oid == _TIME else _money(v) if oid == _MONEY else str(v))
        elif number == 5:
            value = str(np.frombuffer(raw, "<f4")[0]) if oid == _FLOAT4 else \
                _float(struct.unpack("<f", raw)[0])
            value = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(value, value)
        elif number == 6:
            v = struct.unpack("<d", raw)[0]
            value = (_clock(round(v) % _US_PER_DAY) + "+00" if oid == _TIMETZ else
                     _interval(v) if oid == _INTERVAL else _float(v))
        elif number == 7:
            value = "t" if raw else "f"
        elif number == 8:
            value = raw.decode()
        elif number == 9:
            value = "\\x" + raw.hex() if oid == _BYTEA else raw.decode()
        elif number == 10:
            point = dict(fields(raw))
            x, y = (struct.unpack("<d", point[k])[0] for k in (1, 2))
            value = f"({_float(x)},{_float(y)})"
        elif number == 11 and raw:
            value = MISSING
    return name, value


def _simple_datum(buf: bytes) -> tuple[str, Value] | None:
    """The common datum in one pass: a short name (1), a one- or two-byte type oid (2) and a
    string (8), a small int32/int64 (3, 4) or no value (NULL); None for anything else."""
    if len(buf) < 4 or buf[0] != 0x0A or buf[1] >= 0x80:
        return None
    end = 2 + buf[1]
    raw_name = buf[2:end]
    if raw_name[:1] == b'"' or buf[end:end + 1] != b"\x10":
        return None
    oid = buf[end + 1]
    pos = end + 2
    if oid >= 0x80:
        oid = (oid & 0x7F) | (buf[pos] << 7)
        if buf[pos] >= 0x80:
            return None
        pos += 1
    if oid in _CONVERTED:
        return None
    name = raw_name.decode()
    if pos == len(buf):
        return name, None
    tag = buf[pos]
    if tag == 0x42 and pos + 1 < len(buf) and buf[pos + 1] < 0x80 \
            and pos + 2 + buf[pos + 1] == len(buf):  # string, length < 128
        return name, buf[pos + 2:].decode()
    if tag in (0x18, 0x20) and len(buf) - pos <= 5 and buf[-1] < 0x80 \
            and all(b >= 0x80 for b in buf[pos + 1:-1]):  # small non-negative int
        return name, str(_varint(buf, pos + 1)[0])
    return None


_CONVERTED = frozenset({_BYTEA, _DATE, _TIME, _TIMESTAMP, _TIMESTAMPTZ, _TIMETZ, _INTERVAL,
                        _MONEY, 600})
"""Types whose decoderbufs value is not their text output (600: point)."""


class DecoderbufsTranslator:
    """Turns one window of decoderbufs rows into pgoutput messages (module docstring)."""

    def __init__(self, messages: WindowMessages, window_end: int) -> None:
        self.out = messages
        self.window_end = window_end
        self._txn: list[tuple[int, bytes]] = []
        self._xid = 0
        self._time = 0

    def translate(self, lsn: int, data: bytes) -> list[tuple[int, bytes]]:
        """The (LSN, pgoutput message) pairs of one slot row (a whole transaction at its
        COMMIT row, each change at its own LSN).

        Raises:
            DecodeError: a row that is not a decoderbufs RowMessage.
        """
        row: dict[int, Any] = {5: [], 6: []}
        for number, value in fields(data):
            if number in (5, 6):
                row[number].append(value)
            else:
                row[number] = value
        op = row.get(4)
        if op == _BEGIN:
            self._txn, self._xid, self._time = [], int(row.get(1, 0)), int(row.get(2, 0))
            return []
        if op == _COMMIT:
            commit_lsn = min(lsn, self.window_end) - 1
            first = self._txn[0][0] if self._txn else lsn
            out = [(first, begin(commit_lsn, self._time, self._xid)), *self._txn,
                   (lsn, commit(commit_lsn, lsn, self._time))]
            self._txn = []
            return out
        if op not in (_INSERT, _UPDATE, _DELETE) or 3 not in row:
            raise DecodeError(f"decoderbufs row at {lsn:X} has no operation or table "
                              f"(op {op!r})")
        info = self.out.info(*_split_table(row[3].decode()))
        if info is None:
            return []
        new = dict(_datum(d) for d in row[5])
        old = dict(_datum(d) for d in row[6])
        if op == _INSERT:
            msgs = self.out.insert(info, new)
        elif op == _UPDATE:
            msgs = self.out.update(info, new, old or None)
        else:
            msgs = self.out.delete(info, old)
        self._txn += [(lsn, m) for m in msgs]
        return []
