"""PostgreSQL's own ``test_decoding`` output as the oracle for bronze, event by event.

A ``test_decoding`` slot created at the same point of the WAL as the capture slot prints every
committed change with its LSN and xid, and the column values as PostgreSQL's output functions
render them. :func:`oracle_events` turns those lines into the events Debezium semantics
derive from them (a primary-key change is a delete of the old key plus a create of the new
one, STR-2x; a TRUNCATE of several tables is one ``t`` event per table, STR-53), and
:func:`bronze_events` renders bronze rows in the same text form, so that the two lists can be
compared exactly, in commit order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

UNCHANGED = "unchanged-toast-datum"
PLACEHOLDER = "__debezium_unavailable_value"
_TABLE = re.compile(r"^table (.+?): (INSERT|UPDATE|DELETE|TRUNCATE): ?(.*)$", re.S)
_VALUE = re.compile(r"(\w+)\[([^\]]+)\]:('(?:[^']|'')*'|\S+)")
_MESSAGE = re.compile(r"^message: transactional: (\d) prefix: (.*), sz: (\d+) content:(.*)$",
                      re.S)


@dataclass(frozen=True)
class Event:
    """One change event in text form: what ``test_decoding`` prints, per Debezium event."""

    table: str
    op: str
    xid: int
    lsn: int
    key: tuple[str, ...] | None
    before: tuple[tuple[str, str], ...] | None
    after: tuple[tuple[str, str], ...] | None


@dataclass
class Txn:
    """A committed transaction as ``test_decoding`` shows it."""

    xid: int
    end_lsn: int = 0
    events: list[Event] = field(default_factory=list)


@dataclass(frozen=True)
class Message:
    """A logical decoding message (``pg_logical_emit_message``)."""

    transactional: bool
    prefix: str
    content: bytes
    lsn: int
    xid: int | None


def parse_tuple(text: str) -> dict[str, str]:
    """``id[integer]:1 doc[text]:'x'`` -> ``{"id": "1", "doc": "'x'"}``."""
    return {m.group(1): m.group(3) for m in _VALUE.finditer(text)}


def _freeze(values: Mapping[str, str] | None,
            columns: Sequence[str]) -> tuple[tuple[str, str], ...] | None:
    if values is None:
        return None
    return tuple((c, values.get(c, "null")) for c in columns)


def oracle_events(rows: Sequence[tuple[str, int, str]], keys: Mapping[str, Sequence[str]],
                  columns: Mapping[str, Sequence[str]]
                  ) -> tuple[list[Txn], list[Message]]:
    """Committed transactions (in commit order) and messages from ``(lsn, xid, data)`` rows.

    Only tables in ``keys`` are kept. ``columns`` lists each table's columns in order;
    ``keys`` its key columns. Values stay as ``test_decoding`` prints them.
    """
    txns: list[Txn] = []
    messages: list[Message] = []
    current: Txn | None = None
    for lsn_text, xid, data in rows:
        lsn = lsn_int(lsn_text)
        if data.startswith("BEGIN"):
            current = Txn(int(xid))
            continue
        if data.startswith("COMMIT"):
            assert current is not None
            current.end_lsn = lsn
            txns.append(current)
            current = None
            continue
        msg = _MESSAGE.match(data)
        if msg:
            transactional = msg.group(1) == "1"
            content = msg.group(4).encode()
            assert len(content) == int(msg.group(3)), data
            messages.append(Message(transactional, msg.group(2), content, lsn,
                                    int(xid) if transactional else None))
            continue
        m = _TABLE.match(data)
        assert m, data
        assert current is not None, data
        names, kind, rest = m.groups()
        if kind == "TRUNCATE":
            for name in names.split(", "):
                table = name.removeprefix("public.")
                if table in keys:
                    current.events.append(Event(table, "t", int(xid), lsn, None, None, None))
            continue
        table = names.removeprefix("public.")
        if table not in keys:
            continue
        key, cols = keys[table], columns[table]

        at = (table, int(xid), lsn, key, cols)
        if kind == "INSERT":
            current.events.append(_event(at, "c", None, parse_tuple(rest)))
        elif kind == "DELETE":
            current.events.append(_event(at, "d", parse_tuple(rest), None))
        elif rest.startswith("old-key:"):
            old_text, new_text = rest.removeprefix("old-key:").split("new-tuple:")
            old, new = parse_tuple(old_text), parse_tuple(new_text)
            # REPLICA IDENTITY FULL: the old row holds the value of a column the new row
            # marks unchanged TOAST; Debezium's events carry it in after too (STR-48). A
            # key-only old tuple lists the key columns alone.
            new = {c: old[c] if v == UNCHANGED and old.get(c, UNCHANGED) != UNCHANGED else v
                   for c, v in new.items()}
            if tuple(old.get(k) for k in key) != tuple(new.get(k) for k in key) \
                    and all(k in old for k in key):
                current.events.append(_event(at, "d", old, None))
                current.events.append(_event(at, "c", None, new))
            else:
                current.events.append(_event(at, "u", old, new))
        else:
            current.events.append(_event(at, "u", None, parse_tuple(rest)))
    return txns, messages


def _event(at: tuple[str, int, int, Sequence[str], Sequence[str]], op: str,
           before: dict[str, str] | None, after: dict[str, str] | None) -> Event:
    table, xid, lsn, key, cols = at
    image = after if after is not None else before
    assert image is not None
    return Event(table, op, xid, lsn, tuple(image.get(k, "null") for k in key),
                 _freeze(before, cols), _freeze(after, cols))


def lsn_int(text: str) -> int:
    """``'0/16B3748'`` -> its integer value."""
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def as_text(value: Any) -> str:
    """A bronze value as ``test_decoding`` prints it (int4 / int8 / text / bool columns)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no test_decoding rendering for {value!r}")


def bronze_events(table: str, rows: Sequence[Mapping[str, Any]], key: Sequence[str],
                  columns: Sequence[str]) -> list[tuple[tuple[int, int], Event]]:
    """Streamed bronze rows of one table (``op`` c/u/d/t) as ``((commit LSN, ordinal), Event)``.

    A column listed in ``__toast_unchanged`` is rendered as ``test_decoding`` renders an
    unchanged TOAST value; bronze must hold the placeholder there. Under REPLICA IDENTITY FULL
    the old tuple carries the value: bronze's ``after`` holds it, unlisted, and
    :func:`oracle_events` fills the oracle's new tuple likewise.
    """
    out = []
    for row in rows:
        if row["op"] not in ("c", "u", "d", "t"):
            continue
        unchanged = set(row["__toast_unchanged"] or ())

        def image(values: Mapping[str, Any] | None, unchanged: set[str] = unchanged,
                  before: Mapping[str, Any] | None = row["before"]) -> dict[str, str] | None:
            if values is None:
                return None
            rendered = {}
            for c in columns:
                if c in unchanged and values is not before:
                    assert values[c] == PLACEHOLDER, \
                        f"{table}.{c}: unchanged TOAST value is not the placeholder"
                    rendered[c] = UNCHANGED
                else:
                    rendered[c] = as_text(values[c])
            return rendered

        source = row["source"]
        key_values = None if row["key"] is None else tuple(as_text(row["key"][k]) for k in key)
        event = Event(table, row["op"], source["txId"], source["lsn"], key_values,
                      _freeze(image(row["before"]), columns),
                      _freeze(image(row["after"]), columns))
        out.append(((row["__commit_lsn"], row["__ordinal"]), event))
    return out
