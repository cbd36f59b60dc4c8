"""decoderbufs rows (Protobuf ``RowMessage``) -> the pgoutput assembler (:class:`~.rows.RowOutput`).

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

A change row whose shape (table, operation, datums' names and types, type descriptions) the
protobuf runtime has read before in this window is read by the layout learnt from it
(:mod:`.pbrows`); every other row by the protobuf runtime. Both give the same rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from google.protobuf.message import DecodeError as DecodeProtobufError

from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST, Row
from pgcdc_dagster.cdc.plugins.pbrows import Layout, Values, head, learn, typeinfo_at
from pgcdc_dagster.cdc.plugins.pbschema import DATUM, ROW
from pgcdc_dagster.cdc.plugins.pgwire import (
    MISSING,
    TableInfo,
    Value,
    begin,
    commit,
    old_image,
    row_of,
)
from pgcdc_dagster.cdc.plugins.rows import DELETE, INSERT, UPDATE, RowOutput
from pgcdc_dagster.cdc.typeconv.calendar import civil_from_days
from pgcdc_dagster.exceptions import DecodeError

_INSERT, _UPDATE, _DELETE, _BEGIN, _COMMIT = range(5)
_BYTEA, _DATE, _TIME, _TIMESTAMP, _TIMESTAMPTZ, _TIMETZ, _INTERVAL, _MONEY = (
    17, 1082, 1083, 1114, 1184, 1266, 1186, 790)
_FLOAT4 = 700
_US_PER_DAY = 86_400_000_000
_UNKNOWN: Any = object()


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


_DAYS: dict[int, tuple[str, str]] = {}
"""Day number -> (date text without era, era suffix): timestamps of one day share it."""


def _timestamp(us: int, zone: str = "") -> str:
    days, rest = divmod(us, _US_PER_DAY)
    day = _DAYS.get(days)
    if day is None:
        if len(_DAYS) >= 4096:
            _DAYS.clear()
        date = _date(days)
        day = _DAYS[days] = (date[:-3], " BC") if date.endswith(" BC") else (date, "")
    return f"{day[0]} {_clock(rest)}{zone}{day[1]}"


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


def typed_text(oid: int, kind: str, v: Any) -> Value:
    """PostgreSQL's text output of a value decoderbufs sent as ``kind`` (the ``datum``
    field's name; not ``datum_point``) for a column of type ``oid``."""
    if kind == "datum_string":
        return str(v)
    if kind == "datum_int32":
        return _date(v) if oid == _DATE else str(v)
    if kind == "datum_int64":
        return (_timestamp(v) if oid == _TIMESTAMP else
                _timestamp(v, "+00") if oid == _TIMESTAMPTZ else
                _clock(v) if oid == _TIME else _money(v) if oid == _MONEY else str(v))
    if kind == "datum_bool":
        return "t" if v else "f"
    if kind == "datum_double":
        return (_clock(round(v) % _US_PER_DAY) + "+00" if oid == _TIMETZ else
                _interval(v) if oid == _INTERVAL else _float(v))
    if kind == "datum_float":
        return _float4(v)
    if kind == "datum_bytes":
        return "\\x" + v.hex() if oid == _BYTEA else bytes(v).decode()
    # datum_missing (decoderbufs 2.x): an unchanged TOAST value
    return MISSING if v else None


def datum_value(d: Any) -> tuple[str, Value]:
    """(column name, text value) of one ``DatumMessage``."""
    kind = d.WhichOneof("datum")
    value: Value
    if kind is None:
        value = None
    elif kind == "datum_point":
        value = f"({_float(d.datum_point.x)},{_float(d.datum_point.y)})"
    else:
        value = typed_text(d.column_type, kind, getattr(d, kind))
    return _unquote(d.column_name), value


def _datum(buf: bytes) -> tuple[str, Value]:
    """:func:`datum_value` of a serialized ``DatumMessage``."""
    return datum_value(_parse(DATUM, buf))


def _parse(cls: Any, data: bytes) -> Any:
    try:
        return cls.FromString(data)
    except DecodeProtobufError as exc:
        raise DecodeError(f"decoderbufs: not a {cls.DESCRIPTOR.name} ({exc})") from None


@dataclass
class _Shape:
    """A learnt layout of one table's change rows, with the datums' columns."""

    layout: Layout
    op: int
    info: TableInfo
    new_names: list[str]
    old_names: list[str]
    positions: list[int]
    """Column position of each new datum (-1: not a column of the description)."""
    complete: bool = False
    """The new datums are the described columns, in order."""

    def __post_init__(self) -> None:
        self.complete = self.positions == list(range(len(self.info.spec)))


_MAX_SHAPES = 4
"""Layouts kept per (table, op): an update with and without old tuple, ..."""


class DecoderbufsTranslator:
    """Writes one window of decoderbufs rows into a :class:`RowOutput` (module docstring)."""

    def __init__(self, out: RowOutput, window_end: int) -> None:
        self.out = out
        self.window_end = window_end
        self._txn: list[tuple[int, int, TableInfo, Row | None, bool, Row | None]] = []
        self._xid = 0
        self._time = 0
        self._tables: dict[str, TableInfo | None] = {}
        self._shapes: dict[tuple[bytes, int], list[_Shape]] = {}
        """(table as sent, op) -> learnt layouts, the last learnt first."""
        self._skip: set[bytes] = set()
        """Tables (as sent) that are not captured."""
        self._last: _Shape | None = None
        """The layout that read the previous change row: tried first."""

    def translate(self, lsn: int, data: bytes) -> None:
        """Read one slot row: a change is held until its transaction's COMMIT row, which
        writes the whole transaction (each change at its own LSN). A row of a learnt shape
        is read by its layout (:mod:`.pbrows`), any other by the protobuf runtime.

        Raises:
            DecodeError: a row that is not a decoderbufs RowMessage.
        """
        last = self._last
        if last is not None:
            got = last.layout.read(data, typed_text)
            if got is not None:
                self._change(lsn, last.op, last.info, last, *got)
                return
        key = head(data)
        if key is not None:
            if key[0] in self._skip:
                return
            for shape in self._shapes.get(key, ()):
                got = shape.layout.read(data, typed_text)
                if got is not None:
                    self._last = shape
                    self._change(lsn, key[1], shape.info, shape, *got)
                    return
        row = _parse(ROW, data)
        op = row.op if row.HasField("op") else None
        if op == _BEGIN:
            self._txn, self._xid, self._time = [], row.transaction_id, row.commit_time
            return
        if op == _COMMIT:
            commit_lsn = min(lsn, self.window_end) - 1
            out = self.out
            txn, self._txn = self._txn, []
            out.feed(txn[0][0] if txn else lsn, begin(commit_lsn, self._time, self._xid))
            write = out.row
            for change in txn:
                write(*change)
            out.feed(lsn, commit(commit_lsn, lsn, self._time))
            return
        if op not in (_INSERT, _UPDATE, _DELETE) or not row.HasField("table"):
            raise DecodeError(f"decoderbufs row at {lsn:X} has no operation or table "
                              f"(op {op!r})")
        table = row.table
        info = self._tables.get(table, _UNKNOWN)
        if info is _UNKNOWN:
            info = self._tables[table] = self.out.info(*_split_table(table))
        if info is None:
            if key is not None and key[0] == table.encode():
                self._skip.add(key[0])  # its later rows: not even parsed
            return
        new = [datum_value(d) for d in row.new_tuple]
        old = [datum_value(d) for d in row.old_tuple]
        if key is not None:
            self._learn(key, info, row, data)
        self._write(lsn, op, info, dict(new), dict(old))

    def _learn(self, key: tuple[bytes, int], info: TableInfo, row: Any, data: bytes) -> None:
        at = typeinfo_at(data)
        if at is None:
            return
        new = [(d.column_name, d.column_type) for d in row.new_tuple]
        old = [(d.column_name, d.column_type) for d in row.old_tuple]
        position = {name: i for i, (name, _, _) in enumerate(info.spec)}
        new_names = [_unquote(name) for name, _ in new]
        shape = _Shape(learn(key[0], key[1], new, old, data[at:]), key[1], info, new_names,
                       [_unquote(name) for name, _ in old],
                       [position.get(name, -1) for name in new_names])
        shapes = self._shapes.setdefault(key, [])
        shapes.insert(0, shape)
        del shapes[_MAX_SHAPES:]

    def _change(self, lsn: int, op: int, info: TableInfo, shape: _Shape, new: Values,
                old: Values) -> None:
        """A change read by a learnt layout: the same rows as the protobuf path."""
        if old or op == _DELETE:
            new_map = dict(zip(shape.new_names, new, strict=True))
            old_map = dict(zip(shape.old_names, old, strict=True))
            self._write(lsn, op, info, cast(dict[str, Value], new_map),
                        cast(dict[str, Value], old_map))
            return
        # insert, or update without old tuple: by position (a layout never gives MISSING)
        if shape.complete:
            self._txn.append((lsn, INSERT if op == _INSERT else UPDATE, info, None, False,
                              cast(Row, tuple(new))))
            return
        values: Values = [MISSING] * len(info.spec)
        for position, value in zip(shape.positions, new, strict=True):
            if position >= 0:
                values[position] = value
        if MISSING in values:
            toast = op == _UPDATE
            values = [(UNCHANGED_TOAST if toast and varlena else None) if v is MISSING else v
                      for v, (_, _, varlena) in zip(values, info.spec, strict=True)]
        self._txn.append((lsn, INSERT if op == _INSERT else UPDATE, info, None, False,
                          cast(Row, tuple(values))))

    def _write(self, lsn: int, op: int, info: TableInfo, new: dict[str, Value],
               old: dict[str, Value]) -> None:
        if op == _INSERT:
            self._txn.append((lsn, INSERT, info, None, False, row_of(info, new, toast=False)))
            return
        before, key_only = old_image(info, new if op == _UPDATE else None, old or None)
        after = row_of(info, new, toast=True) if op == _UPDATE else None
        self._txn.append((lsn, UPDATE if op == _UPDATE else DELETE, info, before, key_only,
                          after))
