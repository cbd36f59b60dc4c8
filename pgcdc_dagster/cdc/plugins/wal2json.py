"""wal2json (format version 2) rows -> pgoutput protocol-1 messages.

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
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pgcdc_dagster.cdc.plugins.pgwire import Value, WindowMessages, begin, commit, lsn_of, message
from pgcdc_dagster.exceptions import DecodeError

OPTIONS: tuple[tuple[str, str], ...] = (
    ("format-version", "2"), ("include-xids", "1"), ("include-timestamp", "1"),
    ("include-lsn", "1"), ("include-transaction", "1"), ("include-pk", "0"),
    ("include-type-oids", "0"), ("include-typmod", "0"), ("include-not-null", "0"),
)
"""The wal2json options every peek passes (values as text, as the SQL interface wants)."""


_BOOLS: dict[Any, Value] = {True: "t", False: "f"}
_DECODER = json.JSONDecoder(parse_float=str, parse_int=str)


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
    """Turns one window of wal2json rows into pgoutput messages (see the module docstring)."""

    def __init__(self, messages: WindowMessages) -> None:
        self.out = messages
        self._time = 0

    def translate(self, lsn: int, data: bytes) -> list[tuple[int, bytes]]:
        """The (LSN, pgoutput message) pairs of one slot row.

        Raises:
            DecodeError: a row that is not wal2json format version 2.
        """
        try:
            row = _DECODER.decode(data.decode())
            action = row["action"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError(f"wal2json row at {lsn:X} is not format version 2 JSON: "
                              f"{exc}") from None
        return [(lsn, m) for m in self._messages(lsn, row, action)]

    def _messages(self, lsn: int, row: dict[str, Any], action: str) -> list[bytes]:
        if action == "B":
            self._time = _unix_us(row["timestamp"])
            return [begin(lsn_of(row["lsn"]), self._time, int(row["xid"]))]
        if action == "C":
            return [commit(lsn_of(row["lsn"]), lsn_of(row["nextlsn"]),
                           _unix_us(row["timestamp"]))]
        if action == "M":
            content = str(row.get("content", "")).encode()
            return [message(bool(row.get("transactional")), lsn_of(row["lsn"]),
                            str(row["prefix"]), content)]
        info = self.out.info(str(row.get("schema")), str(row.get("table")))
        if info is None:
            return []
        bytea = info.bytea
        if action == "I":
            return self.out.insert(info, _tuple(row.get("columns"), bytea))
        if action == "U":
            return self.out.update(info, _tuple(row.get("columns"), bytea),
                                   _tuple(row.get("identity"), bytea) or None)
        if action == "D":
            return self.out.delete(info, _tuple(row.get("identity"), bytea))
        if action == "T":
            return self.out.truncate([info])
        raise DecodeError(f"wal2json row at {lsn:X} has an unknown action {action!r}")
