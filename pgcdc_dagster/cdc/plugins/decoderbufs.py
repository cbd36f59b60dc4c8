"""decoderbufs rows (Protobuf ``RowMessage``) -> pgoutput protocol-1 messages.

The message layout is decoderbufs' ``proto/pg_logicaldec.proto``. There is no protoc here:
the message classes are built at import from a descriptor written out in :mod:`.pbschema`,
and the ``protobuf`` runtime (upb, installed with Dagster, pinned) parses the rows:

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
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError as DecodeProtobufError

from pgcdc_dagster.cdc.plugins.pbschema import DATUM, ROW
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


def _float4(value: float) -> str:
    text = str(np.float32(value))
    return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(text, text)


def datum_value(d: Any) -> tuple[str, Value]:
    """(column name, text value) of one ``DatumMessage``."""
    oid = d.column_type
    kind = d.WhichOneof("datum")
    value: Value
    if kind is None:
        value = None
    elif kind == "datum_string":
        value = d.datum_string
    elif kind == "datum_int32":
        value = _date(d.datum_int32) if oid == _DATE else str(d.datum_int32)
    elif kind == "datum_int64":
        v = d.datum_int64
        value = (_timestamp(v) if oid == _TIMESTAMP else
                 _timestamp(v, "+00") if oid == _TIMESTAMPTZ else
                 _clock(v) if oid == _TIME else _money(v) if oid == _MONEY else str(v))
    elif kind == "datum_bool":
        value = "t" if d.datum_bool else "f"
    elif kind == "datum_double":
        v = d.datum_double
        value = (_clock(round(v) % _US_PER_DAY) + "+00" if oid == _TIMETZ else
                 _interval(v) if oid == _INTERVAL else _float(v))
    elif kind == "datum_float":
        value = _float4(d.datum_float)
    elif kind == "datum_bytes":
        raw = d.datum_bytes
        value = "\\x" + raw.hex() if oid == _BYTEA else raw.decode()
    elif kind == "datum_point":
        value = f"({_float(d.datum_point.x)},{_float(d.datum_point.y)})"
    else:  # datum_missing (decoderbufs 2.x): an unchanged TOAST value
        value = MISSING if d.datum_missing else None
    return _unquote(d.column_name), value


def _datum(buf: bytes) -> tuple[str, Value]:
    """:func:`datum_value` of a serialized ``DatumMessage``."""
    return datum_value(_parse(DATUM, buf))


def _parse(cls: Any, data: bytes) -> Any:
    try:
        return cls.FromString(data)
    except DecodeProtobufError as exc:
        raise DecodeError(f"decoderbufs: not a {cls.DESCRIPTOR.name} ({exc})") from None


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
        row = _parse(ROW, data)
        op = row.op if row.HasField("op") else None
        if op == _BEGIN:
            self._txn, self._xid, self._time = [], row.transaction_id, row.commit_time
            return []
        if op == _COMMIT:
            commit_lsn = min(lsn, self.window_end) - 1
            first = self._txn[0][0] if self._txn else lsn
            out = [(first, begin(commit_lsn, self._time, self._xid)), *self._txn,
                   (lsn, commit(commit_lsn, lsn, self._time))]
            self._txn = []
            return out
        if op not in (_INSERT, _UPDATE, _DELETE) or not row.HasField("table"):
            raise DecodeError(f"decoderbufs row at {lsn:X} has no operation or table "
                              f"(op {op!r})")
        info = self.out.info(*_split_table(row.table))
        if info is None:
            return []
        new = dict(datum_value(d) for d in row.new_tuple)
        old = dict(datum_value(d) for d in row.old_tuple)
        if op == _INSERT:
            msgs = self.out.insert(info, new)
        elif op == _UPDATE:
            msgs = self.out.update(info, new, old or None)
        else:
            msgs = self.out.delete(info, old)
        self._txn += [(lsn, m) for m in msgs]
        return []
