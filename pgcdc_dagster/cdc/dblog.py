"""DBLog window logic for incremental snapshots (design.md §3 decision 6; INC- items).

Pure: no I/O. The capture layer reads a chunk between a low and a high watermark (logical
decoding messages with prefix :data:`WATERMARK_PREFIX`) and feeds every decoded window to a
:class:`ChunkWindow`, which

* drops buffered chunk rows whose key has a change event (c/u/d, either side of a key change)
  committed between the watermarks; a TRUNCATE of the table in that span drops the chunk;
* emits the survivors, when the high watermark arrives, as ``op = r`` rows with the high
  watermark's position as their sequence (commit LSN and ``total_order`` of the HW message);
* avoids the TOAST trap: when the first in-window event of a buffered key carries an
  unchanged-TOAST column, that event alone cannot restore the value (silver may not hold the
  row yet, e.g. a table newly added to the capture), so the chunk row is emitted with a
  sequence just before that event (same commit LSN, ordinal one lower). Silver then applies
  the chunk row first and the event keeps the chunk's value for its unchanged columns.

"In window" means: commit LSN above the low watermark message's own LSN (the LSN
``pg_logical_emit_message`` returned, so transactions that commit between the message and
its commit record count as in-window, which is conservative) and below the high watermark's
commit LSN (anything that commits before the HW commit record may be invisible to the chunk
read yet would sort before the chunk rows, so it must evict them).

Signal payloads (Debezium ``execute-snapshot``, ``stop-snapshot``, ``pause-snapshot``,
``resume-snapshot``) are parsed here too.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from pgcdc_dagster.cdc.changes import (
    UNCHANGED_TOAST,
    LogicalMessage,
    Relation,
    Row,
    TableChanges,
    Window,
)
from pgcdc_dagster.names import parse_table_id, table_id

WATERMARK_PREFIX = "pgcdc.watermark"
SNAPSHOT_MARKER = "incremental"
"""``source.snapshot`` of incremental-snapshot READ events (INC-22)."""

Key = tuple[bytes | None, ...]


# --- watermarks ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Watermark:
    """Content of one watermark message."""

    snapshot_id: str
    table: str
    chunk: int
    kind: str
    """``low`` or ``high``."""

    def encode(self) -> str:
        return json.dumps({"id": self.snapshot_id, "table": self.table, "chunk": self.chunk,
                           "kind": self.kind}, sort_keys=True)


def parse_watermark(msg: LogicalMessage) -> Watermark | None:
    """The watermark a message carries, or None for any other message."""
    if msg.prefix != WATERMARK_PREFIX:
        return None
    try:
        data = json.loads(msg.content.decode("utf-8"))
        return Watermark(str(data["id"]), str(data["table"]), int(data["chunk"]),
                         str(data["kind"]))
    except (ValueError, KeyError, TypeError):
        return None


# --- the window -----------------------------------------------------------------------------

def _positions(relation: Relation, names: Sequence[str]) -> list[int] | None:
    index = {c.name: i for i, c in enumerate(relation.columns)}
    if not all(n in index for n in names):
        return None
    return [index[n] for n in names]


def _key_of(row: Row | None, pos: Sequence[int]) -> Key | None:
    if row is None:
        return None
    values = tuple(row[p] for p in pos)
    if any(v is UNCHANGED_TOAST for v in values):
        return None
    return values  # type: ignore[return-value]


@dataclass
class ChunkResult:
    """What one window contributed to a chunk."""

    segments: list[TableChanges] = field(default_factory=list)
    """Segments to append to the window's table (``op = r``, ``snapshot`` set)."""
    closed: bool = False
    """The high watermark was in this window: the chunk is finished."""
    dropped: int = 0
    emitted: int = 0
    early: int = 0
    """Rows emitted before an unchanged-TOAST event (the TOAST trap)."""
    truncated: bool = False


@dataclass
class ChunkWindow:
    """One chunk buffered between its watermarks, waiting for the high watermark."""

    snapshot_id: str
    table: tuple[str, str]
    chunk: int
    relation: Relation
    """The captured relation; chunk rows are tuples in its column order (text bytes)."""
    key_names: tuple[str, ...]
    rows: dict[Key, Row]
    low_lsn: int
    """LSN ``pg_logical_emit_message`` returned for the low watermark."""
    snapshot: str = SNAPSHOT_MARKER
    dropped: int = 0
    early: int = 0
    truncated: bool = False

    @classmethod
    def from_rows(cls, snapshot_id: str, table: tuple[str, str], chunk: int,
                  relation: Relation, key_names: Sequence[str], rows: Iterable[Row],
                  low_lsn: int) -> ChunkWindow:
        pos = _positions(relation, key_names)
        if pos is None:
            raise ValueError(f"key {key_names} not in {relation.namespace}.{relation.name}")
        rows = rows if isinstance(rows, list) else list(rows)
        # Keys at C speed: itemgetter of one position gives the value, zip makes the 1-tuple.
        keys = map(itemgetter(*pos), rows) if len(pos) > 1 else \
            zip(map(itemgetter(pos[0]), rows), strict=True)
        buffered: dict[Key, Row] = dict(zip(keys, rows, strict=True))
        return cls(snapshot_id, table, chunk, relation, tuple(key_names), buffered, low_lsn)

    def _is_mine(self, mark: Watermark | None, kind: str) -> bool:
        return (mark is not None and mark.kind == kind and mark.snapshot_id == self.snapshot_id
                and mark.chunk == self.chunk
                # table_id now; a snapshot started by an older version wrote the plain name
                and mark.table in (table_id(*self.table), ".".join(self.table)))

    def high_watermark(self, window: Window) -> LogicalMessage | None:
        for msg in window.messages:
            if self._is_mine(parse_watermark(msg), "high"):
                return msg
        return None

    def observe(self, window: Window) -> ChunkResult:
        """Apply one window's events to the buffer; close the chunk at its high watermark."""
        result = ChunkResult()
        high = self.high_watermark(window)
        upper = high.commit_lsn if high is not None else None
        early: list[tuple[int, int, int, int, int, Row]] = []
        for seg in window.tables.get(self.table, []):
            if seg.snapshot is not None:
                continue
            pos = _positions(seg.relation, self.key_names)
            mine = _positions(seg.relation, [c.name for c in self.relation.columns])
            for i, op in enumerate(seg.op):
                commit = seg.commit_lsn[i]
                if commit <= self.low_lsn or (upper is not None and commit >= upper):
                    continue
                if op == "t":
                    self.truncated = True
                    self.dropped += len(self.rows)
                    self.rows.clear()
                    continue
                if pos is None or not self.rows:
                    continue
                after = seg.after[i]
                after_key = _key_of(after, pos)
                toast = (after is not None and mine is not None
                         and any(after[p] is UNCHANGED_TOAST for p in mine))
                for key in {_key_of(seg.before[i], pos), after_key}:
                    if key is None or key not in self.rows:
                        continue
                    row = self.rows.pop(key)
                    self.dropped += 1
                    if toast and key == after_key:
                        early.append((commit, seg.total_order[i] - 1, seg.lsn[i], seg.xid[i],
                                      seg.commit_ts_us[i], row))
        if early:
            early.sort(key=lambda e: (e[0], e[1]))
            self.early += len(early)
            result.early = len(early)
            result.segments.append(self._segment(early))
        if high is not None:
            result.closed = True
            if self.rows:
                result.segments.append(self._survivors(high))
                result.emitted = len(self.rows)
        result.dropped = self.dropped
        result.truncated = self.truncated
        return result

    def _survivors(self, high: LogicalMessage) -> TableChanges:
        """The buffered rows as one segment at the high watermark's position (column-wise:
        every row shares the position)."""
        n = len(self.rows)
        return TableChanges(
            self.relation, op=["r"] * n, commit_lsn=[high.commit_lsn] * n,
            lsn=[high.lsn] * n, xid=[high.xid or 0] * n,
            commit_ts_us=[high.commit_ts_us or 0] * n, total_order=[high.total_order] * n,
            collection_order=[0] * n, before=[None] * n, before_key_only=[False] * n,
            after=list(self.rows.values()), truncate_options=[0] * n, snapshot=self.snapshot)

    def _segment(self, rows: Sequence[tuple[int, int, int, int, int, Row]]) -> TableChanges:
        seg = TableChanges(self.relation, snapshot=self.snapshot)
        for commit, ordinal, lsn, xid, ts, row in rows:
            seg.op.append("r")
            seg.commit_lsn.append(commit)
            seg.total_order.append(ordinal)
            seg.collection_order.append(0)
            seg.lsn.append(lsn)
            seg.xid.append(xid)
            seg.commit_ts_us.append(ts)
            seg.before.append(None)
            seg.before_key_only.append(False)
            seg.after.append(row)
            seg.truncate_options.append(0)
        return seg


# --- signals ----------------------------------------------------------------------------------

SIGNAL_TYPES = ("execute-snapshot", "stop-snapshot", "pause-snapshot", "resume-snapshot", "log")


class SignalError(ValueError):
    """A signal whose payload cannot be honoured."""


@dataclass(frozen=True, slots=True)
class Signal:
    """A Debezium signal (``id``, ``type``, ``data``)."""

    id: str
    type: str
    data_collections: tuple[str, ...] = ()
    """``data-collections``: regular expressions over ``schema.table``."""
    snapshot_type: str = "incremental"
    additional_conditions: tuple[tuple[str, str], ...] = ()
    """``additional-conditions``: (data-collection regex, filter) pairs."""
    surrogate_key: str | None = None
    message: str | None = None
    """``log`` signals: the message to log."""


def parse_signal(signal_id: str, signal_type: str, data: str | dict[str, Any] | None) -> Signal:
    """Parse a signal as Debezium's signalling table carries it.

    Raises:
        SignalError: an unknown type, a non-incremental snapshot type, or a malformed payload.
    """
    if signal_type not in SIGNAL_TYPES:
        raise SignalError(f"signal {signal_id}: unknown type {signal_type!r}; expected one of "
                          f"{', '.join(SIGNAL_TYPES)}")
    if isinstance(data, str):
        try:
            payload = json.loads(data) if data.strip() else {}
        except ValueError as exc:
            raise SignalError(f"signal {signal_id}: data is not JSON: {exc}") from None
    else:
        payload = dict(data or {})
    if not isinstance(payload, dict):
        raise SignalError(f"signal {signal_id}: data must be a JSON object")
    if signal_type == "log":
        return Signal(signal_id, signal_type, message=str(payload.get("message", "")))
    collections = payload.get("data-collections") or []
    if not isinstance(collections, list) or not all(isinstance(c, str) for c in collections):
        raise SignalError(f"signal {signal_id}: data-collections must be a list of strings")
    kind = str(payload.get("type", "incremental")).lower()
    if signal_type == "execute-snapshot" and kind != "incremental":
        raise SignalError(f"signal {signal_id}: snapshot type {kind!r} is not supported; only "
                          "'incremental' is")
    conditions: list[tuple[str, str]] = []
    for item in payload.get("additional-conditions") or []:
        if not isinstance(item, dict) or not isinstance(item.get("data-collection"), str) \
                or not isinstance(item.get("filter"), str):
            raise SignalError(f"signal {signal_id}: additional-conditions entries need "
                              "'data-collection' and 'filter' strings")
        conditions.append((item["data-collection"], item["filter"]))
    legacy = payload.get("additional-condition")
    if isinstance(legacy, str) and legacy.strip():
        conditions += [(c, legacy) for c in collections]
    surrogate = payload.get("surrogate-key")
    for pattern in [*collections, *(c for c, _ in conditions)]:
        try:
            re.compile(collection_regex(pattern))
        except re.error as exc:
            raise SignalError(f"signal {signal_id}: bad data-collection {pattern!r}: "
                              f"{exc}") from None
    return Signal(signal_id, signal_type, tuple(collections), kind, tuple(conditions),
                  str(surrogate) if surrogate else None)


def collection_regex(pattern: str) -> str:
    """A ``data-collections`` entry as a regex over a table's
    :func:`~pgcdc_dagster.names.table_id`.

    Debezium quotes name parts containing a dot (``"public"."My.Table"``, INC-16): an entry
    with a double-quoted part that reads as ``<schema>.<table>`` (``"a.b".c``, ``a."b.c"``,
    ``"a"."b"``) names that one table literally; any other entry is a regular expression.
    """
    if '"' in pattern:
        try:
            return re.escape(table_id(*parse_table_id(pattern)))
        except ValueError:
            pass
    return pattern


def matching_tables(patterns: Sequence[str], tables: Iterable[tuple[str, str]]
                    ) -> list[tuple[str, str]]:
    """Captured tables a ``data-collections`` entry names: the entry fully matches the
    table's :func:`~pgcdc_dagster.names.table_id` (a name part holding a dot is
    double-quoted there) or, as before quoting, its plain ``schema.table`` when no other
    captured table reads the same (``"a.b".c`` and ``a."b.c"`` are both ``a.b.c``).

    Raises:
        SignalError: an entry that tells two such tables apart only by their quoting.
    """
    regexes = [(p, re.compile(collection_regex(p))) for p in patterns]
    tables = list(tables)
    plain = Counter(f"{s}.{t}" for s, t in tables)
    out = []
    for schema, table in tables:
        ident, flat = table_id(schema, table), f"{schema}.{table}"
        for pattern, regex in regexes:
            if regex.fullmatch(ident):
                out.append((schema, table))
                break
            if regex.fullmatch(flat):
                if plain[flat] > 1:
                    same = sorted(table_id(s, t) for s, t in tables if f"{s}.{t}" == flat)
                    raise SignalError(
                        f"data-collection '{pattern}' is ambiguous: {' and '.join(same)} "
                        f"both read as '{flat}'; double-quote the part that holds the dot, "
                        f"e.g. {same[0]}")
                out.append((schema, table))
                break
    return out
