"""wal2json (format version 2) rows -> the pgoutput assembler (:class:`~.rows.RowOutput`).

Format version 2 writes one JSON object per row of the slot: ``B`` (begin; with
``include-lsn`` its ``lsn`` is the commit LSN and ``nextlsn`` the end LSN), ``I`` / ``U`` /
``D`` with ``columns`` (the new tuple) and ``identity`` (the old key or, under REPLICA
IDENTITY FULL, the old row), ``T`` (truncate, one row per table), ``M`` (logical decoding
message) and ``C`` (commit). Values are JSON: numbers are written as PostgreSQL prints them
(kept as text here, never through a float), booleans as ``true``/``false``, everything else
as the text output in a string.

What wal2json cannot carry (``docs/plugins.md``): NaN and +/-Infinity of ``real`` / ``double
precision`` / ``numeric`` come as JSON ``null`` (STR-35); an unchanged TOAST value is left out
of ``columns``, read here as unchanged (STR-46); a non-transactional message is written
inside a Begin/Commit of its own by wal2json and is read as such. Rows of tables that are
not captured are skipped.

Two ways to read a change row, giving the same rows: the fast path, one regular expression
per table and action over the row as wal2json writes it (compact, every column present, names
without characters JSON escapes), values taken from the matched text; and the general path,
Python's ``json`` module (numbers parsed as text), for every other row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, cast

from pgcdc_dagster.cdc.changes import Row
from pgcdc_dagster.cdc.changes import Value as RowValue
from pgcdc_dagster.cdc.plugins.pgwire import TableInfo, Value, begin, commit, lsn_of, message
from pgcdc_dagster.cdc.plugins.rows import DELETE, INSERT, UPDATE, RowOutput
from pgcdc_dagster.exceptions import DecodeError

OPTIONS: tuple[tuple[str, str], ...] = (
    ("format-version", "2"), ("include-xids", "1"), ("include-timestamp", "1"),
    ("include-lsn", "1"), ("include-transaction", "1"), ("include-pk", "0"),
    ("include-types", "0"), ("include-type-oids", "0"), ("include-typmod", "0"),
    ("include-not-null", "0"),
)
"""The wal2json options every peek passes (values as text, as the SQL interface wants)."""


_BOOLS: dict[Any, Value] = {True: "t", False: "f"}
_DECODER = json.JSONDecoder(parse_float=str, parse_int=str)
_SCANSTRING: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]

# --- the fast path: one regular expression per table and action ------------------------------
# Inside a JSON string every '"' is escaped, so '{"name":"c","value":' and the keys around it
# can only be wal2json's own structure; a row that does not match exactly takes the general
# path below (json module), which gives the same values.
_HEAD_FIELDS = rb'(?:"xid":[0-9]+,)?(?:"timestamp":"[^"\\]*",)?(?:"lsn":"[^"\\]*",)?'
_HEAD = re.compile(rb'\{"action":"([IUD])",' + _HEAD_FIELDS
                   + rb'"schema":"([^"\\]*)","table":"([^"\\]*)",')
_VALUE = (rb'("[^"\\]*(?:\\.[^"\\]*)*"'  # a string (escapes kept, undone below)
          rb'|-?[0-9][0-9.eE+-]*|true|false|null)')  # a number as PostgreSQL printed it
_PLAIN_NAME = re.compile(r'[^"\\\x00-\x1f]*')
_TRUE, _FALSE = b"t", b"f"


def _json_value(raw: bytes) -> RowValue:
    """One matched JSON value as the type's text output (None for null)."""
    first = raw[0]
    if first == 0x22:  # '"'
        escapes = raw.count(b"\\")
        if not escapes:
            return raw[1:-1]
        if escapes == raw.count(b'\\"'):  # only \" (JSON in a string): no decoding needed
            return raw[1:-1].replace(b'\\"', b'"')
        try:
            return _SCANSTRING(raw.decode(), 1)[0].encode()
        except ValueError as exc:
            raise DecodeError(f"wal2json: bad JSON string {raw!r:.60} ({exc})") from None
    if first == 0x6E:  # null
        return None
    if first == 0x74:  # true
        return _TRUE
    if first == 0x66:  # false
        return _FALSE
    return raw


Match = Callable[[bytes], "re.Match[bytes] | None"]
Handler = Callable[[int, "re.Match[bytes]"], None]


class _FastTable:
    """The fast path of one captured table: a row of an action whose columns (and identity)
    are exactly the catalog's, in order, is read with one match of a regular expression and
    written as rows (``Assembler.decoded_change``)."""

    def __init__(self, info: TableInfo, out: RowOutput) -> None:
        rel = info.relation
        self.oid = out.describe(info)
        self.change = out.assembler.decoded_change
        full = rel.replica_identity == "f"
        self.full = full
        self.width = len(rel.columns)
        self.keys = [i for i, c in enumerate(rel.columns) if c.is_key]
        self.bytea = [i for i, c in enumerate(rel.columns) if c.name in info.bytea]
        self.key_bytea = [n for n, i in enumerate(self.keys) if i in self.bytea]
        self.key_pairs = [(self.width + n, i) for n, i in enumerate(self.keys)]
        """(identity group, column group) of each key column."""

        def items(positions: list[int] | range) -> bytes:
            return b",".join(b'\\{"name":"' + re.escape(rel.columns[i].name.encode())
                             + b'","value":' + _VALUE + b"\\}" for i in positions)

        def head(action: bytes) -> bytes:
            return (b'\\{"action":"' + action + b'",' + _HEAD_FIELDS + b'"schema":"'
                    + re.escape(rel.namespace.encode()) + b'","table":"'
                    + re.escape(rel.name.encode()) + b'",')

        columns = b'"columns":\\[' + items(range(self.width)) + b"\\]"
        identity = b'"identity":\\[' + items(range(self.width) if full else self.keys) \
            + b"\\]"
        self.paths: dict[bytes, tuple[Match, Handler]] = {
            b"I": (re.compile(head(b"I") + columns + b"\\}").fullmatch, self.insert),
            b"U": (re.compile(head(b"U") + columns + b"(?:," + identity + b")?\\}").fullmatch,
                   self.update),
            b"D": (re.compile(head(b"D") + identity + b"\\}").fullmatch, self.delete),
        }

    def values(self, raw: tuple[bytes, ...], bytea: list[int]) -> list[RowValue]:
        """The matched JSON values as text output; ``bytea``: positions of bytea values."""
        # numbers as they are, strings without escapes sliced, the rest by _json_value
        out = [v if (c := v[0]) < 0x3A and c != 0x22 else v[1:-1]
               if c == 0x22 and 0x5C not in v else _json_value(v) for v in raw]
        for i in bytea:  # wal2json writes bytea as bare hex
            value = out[i]
            if isinstance(value, bytes):
                out[i] = b"\\x" + value
        return out

    def insert(self, lsn: int, m: re.Match[bytes]) -> None:
        if self.bytea:
            row = tuple(self.values(m.groups(), self.bytea))
        else:  # values() inlined: the hottest path
            row = tuple([v if (c := v[0]) < 0x3A and c != 0x22 else v[1:-1]
                         if c == 0x22 and 0x5C not in v else _json_value(v)
                         for v in m.groups()])
        self.change(lsn, INSERT, self.oid, None, False, row)

    def update(self, lsn: int, m: re.Match[bytes]) -> None:
        groups = m.groups()
        width = self.width
        before: Row | None = None
        if groups[width] is not None:  # the identity: old key, or old row under FULL
            if self.full:
                before = tuple(self.values(groups[width:], self.bytea))
            elif any(groups[o] != groups[i] for o, i in self.key_pairs):
                before = self._key_row(self.values(groups[width:], self.key_bytea))
        self.change(lsn, UPDATE, self.oid, before, before is not None and not self.full,
                    tuple(self.values(groups[:width], self.bytea)))

    def delete(self, lsn: int, m: re.Match[bytes]) -> None:
        if self.full:
            before = tuple(self.values(m.groups(), self.bytea))
        else:
            before = self._key_row(self.values(m.groups(), self.key_bytea))
        self.change(lsn, DELETE, self.oid, before, not self.full, None)

    def _key_row(self, key_values: list[RowValue]) -> Row:
        row: list[RowValue] = [None] * self.width
        for n, i in enumerate(self.keys):
            row[i] = key_values[n]
        return tuple(row)


def _fast_table(info: TableInfo, out: RowOutput) -> _FastTable | None:
    """The table's fast path, if its names are written by wal2json unescaped."""
    rel = info.relation
    if all(_PLAIN_NAME.fullmatch(name)
           for name in (rel.namespace, rel.name, *(c.name for c in rel.columns))):
        return _FastTable(info, out)
    return None


def _tuple(items: list[Mapping[str, Any]] | None, bytea: frozenset[str]) -> dict[str, Value]:
    """Column values as text output; wal2json writes ``bytea`` as bare hex (no ``\\x``)."""
    out: dict[str, Value] = {}
    for c in items or ():
        value = c.get("value")
        if value is not None and value.__class__ is not str:
            if value.__class__ is not bool:
                raise DecodeError(f"wal2json: unexpected value {value!r:.60}")
            value = _BOOLS[value]
        out[c["name"]] = value
    if not bytea:
        return out
    for name in bytea.intersection(out):
        value = out[name]
        if isinstance(value, str):
            out[name] = "\\x" + value
    return out


def _unix_us(text: str) -> int:
    """wal2json's ``timestamp`` (``2026-11-25 22:31:10.33771+00``) -> µs since the epoch."""
    stamp = datetime.fromisoformat(text if len(text) < 3 or text[-3] not in "+-"
                                   else text + ":00")
    return int(stamp.timestamp()) * 1_000_000 + stamp.microsecond


class Wal2JsonTranslator:
    """Writes one window of wal2json rows into a :class:`RowOutput` (module docstring)."""

    def __init__(self, out: RowOutput) -> None:
        self.out = out
        self._time = 0
        self._fast: dict[tuple[bytes, bytes], _FastTable | None] = {}
        """(schema, table) as wal2json writes them -> the fast path (None: none)."""
        self._skip: set[tuple[bytes, bytes]] = set()
        """Tables that are not captured."""
        self._last: tuple[Match, Handler] | None = None
        """The fast path that read the previous row: tried first."""

    def translate(self, lsn: int, data: bytes) -> None:
        """Write one slot row (a change at its own LSN).

        Raises:
            DecodeError: a row that is not wal2json format version 2.
        """
        last = self._last
        if last is not None:
            m = last[0](data)
            if m is not None:
                last[1](lsn, m)
                return
        head = _HEAD.match(data)
        if head is not None:
            name = cast(tuple[bytes, bytes], head.group(2, 3))
            if name in self._skip:
                return
            fast = self._fast[name] if name in self._fast else self._fast_for(name)
            if fast is not None:
                path = fast.paths[head.group(1)]
                m = path[0](data)
                if m is not None:
                    self._last = path
                    path[1](lsn, m)
                    return
            elif name in self._skip:
                return
        try:
            row = _DECODER.decode(data.decode())
            action = row["action"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError(f"wal2json row at {lsn:X} is not format version 2 JSON: "
                              f"{exc}") from None
        self._general(lsn, row, action)

    def _fast_for(self, name: tuple[bytes, bytes]) -> _FastTable | None:
        try:
            info = self.out.info(name[0].decode(), name[1].decode())
        except UnicodeDecodeError:  # the general path reports the row
            info = None
        else:
            if info is None:
                self._skip.add(name)
                return None
        fast = self._fast[name] = None if info is None else _fast_table(info, self.out)
        return fast

    def _general(self, lsn: int, row: dict[str, Any], action: str) -> None:
        out = self.out
        if action == "B":
            self._time = _unix_us(row["timestamp"])
            out.feed(lsn, begin(lsn_of(row["lsn"]), self._time, int(row["xid"])))
            return
        if action == "C":
            out.feed(lsn, commit(lsn_of(row["lsn"]), lsn_of(row["nextlsn"]),
                                 _unix_us(row["timestamp"])))
            return
        if action == "M":
            content = str(row.get("content", "")).encode()
            out.feed(lsn, message(bool(row.get("transactional")), lsn_of(row["lsn"]),
                                  str(row["prefix"]), content))
            return
        info = out.info(str(row.get("schema")), str(row.get("table")))
        if info is None:
            return
        bytea = info.bytea
        if action == "I":
            out.insert(lsn, info, _tuple(row.get("columns"), bytea))
        elif action == "U":
            out.update(lsn, info, _tuple(row.get("columns"), bytea),
                       _tuple(row.get("identity"), bytea) or None)
        elif action == "D":
            out.delete(lsn, info, _tuple(row.get("identity"), bytea))
        elif action == "T":
            out.truncate(lsn, [info])
        else:
            raise DecodeError(f"wal2json row at {lsn:X} has an unknown action {action!r}")
