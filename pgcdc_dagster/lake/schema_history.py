"""The bronze schema history, keyed by LSN.

One Delta table beside bronze, ``<lakehouse>/bronze/_pgcdc/schema_history``, holds a row per
shape change of a captured table: from position ``(lsn, ordinal)`` on (bronze's
``__commit_lsn`` / ``__ordinal`` order), the table's events have the columns listed in
``columns`` (a JSON list of ``{"name", "field", "key", "schema"}``: the source column, the
bronze field holding its value (see ``cdc/column_versions.py``), whether it is a key column,
and its Kafka Connect schema as Debezium wrote it then). The shape of an event is the entry
with the greatest position at or before the event.

Entries are written before the bronze commit of the events they describe, and only when the
shape differs from the one in force there, so a replay after a crash writes nothing new (or
a harmless duplicate). The export (``export.py``) reads it to give each event the schema of
its time, and to put a versioned field's value back under its column's name.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.quoting import sql_ident, sql_literal
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.lake.delta import ensure_table, open_table, write_table
from pgcdc_dagster.lake.paths import internal_uri

HISTORY_SCHEMA = pa.schema([
    pa.field("schema", pa.string(), nullable=False),
    pa.field("table", pa.string(), nullable=False),
    pa.field("lsn", pa.int64(), nullable=False),
    pa.field("ordinal", pa.int64(), nullable=False),
    pa.field("shape_id", pa.string(), nullable=False),
    pa.field("columns", pa.string(), nullable=False),
    pa.field("recorded_ms", pa.int64(), nullable=False),
])


def history_uri(lakehouse: str) -> str:
    """Where the schema history of a lakehouse lives."""
    return internal_uri(lakehouse, "schema_history")


@dataclass(frozen=True, slots=True)
class Shape:
    """The columns of a table's events, as the schema history records them."""

    columns: str
    """JSON list of ``{"name", "field", "key", "schema"}``."""
    shape_id: str

    @classmethod
    def of(cls, relation: Relation, converters: Sequence[ColumnConverter]) -> Shape:
        cols = []
        for col, conv in zip(relation.columns, converters, strict=True):
            schema = dict(conv.connect_schema())
            schema.pop("field", None)
            cols.append({"name": col.name, "field": conv.bronze_field.name,
                         "key": col.is_key, "schema": schema})
        text = json.dumps(cols, separators=(",", ":"), sort_keys=True)
        return cls(text, hashlib.sha256(text.encode()).hexdigest()[:24])

    def parsed(self) -> list[dict[str, Any]]:
        return list(json.loads(self.columns))


@dataclass(frozen=True, slots=True)
class Entry:
    """One history row: the shape in force from ``(lsn, ordinal)`` on."""

    lsn: int
    ordinal: int
    shape: Shape


def read_history(uri: str, schema: str, table: str) -> list[Entry]:
    """The entries of one table, oldest position first (duplicates collapsed)."""
    delta = open_table(uri)
    if delta is None:
        return []
    data = delta.to_pyarrow_table()
    mine = data.filter(pc.and_(pc.equal(data["schema"], schema), pc.equal(data["table"], table)))
    return _entries(mine.to_pylist())


def read_histories(uri: str) -> dict[tuple[str, str], list[Entry]]:
    """The entries of every table, read once (a run loading many tables' contexts)."""
    delta = open_table(uri)
    if delta is None:
        return {}
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in delta.to_pyarrow_table().to_pylist():
        rows.setdefault((row["schema"], row["table"]), []).append(row)
    return {name: _entries(mine) for name, mine in rows.items()}


def _entries(rows: list[dict[str, Any]]) -> list[Entry]:
    rows = sorted(rows, key=lambda r: (r["lsn"], r["ordinal"], r["recorded_ms"]))
    out: list[Entry] = []
    for r in rows:
        entry = Entry(int(r["lsn"]), int(r["ordinal"]), Shape(r["columns"], r["shape_id"]))
        if out and (out[-1].lsn, out[-1].ordinal) == (entry.lsn, entry.ordinal):
            out[-1] = entry  # the later recording wins at the same position
        elif not out or out[-1].shape.shape_id != entry.shape.shape_id:
            out.append(entry)
    return out


def shape_at(entries: Sequence[Entry], lsn: int, ordinal: int) -> Entry | None:
    """The entry in force at ``(lsn, ordinal)`` (None before the first entry)."""
    keys = [(e.lsn, e.ordinal) for e in entries]
    i = bisect.bisect_right(keys, (lsn, ordinal))
    return entries[i - 1] if i else None


class HistoryBatch:
    """Entries of many tables written with one append (a run loading a thousand tables'
    contexts writes one commit, not one per table). Recorders given a batch
    buffer their entries in it until :meth:`flush`; afterwards they write directly."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.rows: list[dict[str, Any]] | None = []

    def flush(self) -> None:
        rows, self.rows = self.rows, None
        if rows:
            ensure_table(self.uri, HISTORY_SCHEMA)
            write_table(self.uri, pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA),
                        mode="append")


class HistoryRecorder:
    """Records a table's shapes as events are written (cached; one Delta read per run).

    Picklable only before first use; contexts carry one, the driver uses it.
    """

    def __init__(self, uri: str, schema: str, table: str,
                 entries: list[Entry] | None = None,
                 batch: HistoryBatch | None = None) -> None:
        """``entries``: the table's history when the caller read it already
        (:func:`read_histories`); ``batch``: buffer the entries there until it is flushed."""
        self.uri = uri
        self.schema = schema
        self.table = table
        self._entries: list[Entry] | None = entries
        self._batch = batch

    def entries(self) -> list[Entry]:
        if self._entries is None:
            self._entries = read_history(self.uri, self.schema, self.table)
        return self._entries

    def restart(self, shape: Shape) -> None:
        """Start the table's history afresh with ``shape`` at position 0.

        For a table bronze holds no event of (no offset yet, or bronze removed by a
        teardown): older entries describe no stored event, and a stale later entry would
        shadow the new start.
        """
        if not self.uri:
            return
        entries = self.entries()
        if [(e.lsn, e.ordinal, e.shape.shape_id) for e in entries] == [(0, 0, shape.shape_id)]:
            return
        if entries:
            delta = open_table(self.uri)
            if delta is not None:
                delta.delete(f"{sql_ident('schema')} = {sql_literal(self.schema)} AND "
                             f"{sql_ident('table')} = {sql_literal(self.table)}")
            entries.clear()
        self.record(shape, 0, 0)

    def record(self, shape: Shape, lsn: int, ordinal: int) -> bool:
        """Write an entry when ``shape`` is not the one in force at the position."""
        if not self.uri:
            return False
        entries = self.entries()
        current = shape_at(entries, lsn, ordinal)
        if current is not None and current.shape.shape_id == shape.shape_id:
            return False
        row = {"schema": self.schema, "table": self.table, "lsn": int(lsn),
               "ordinal": int(ordinal), "shape_id": shape.shape_id, "columns": shape.columns,
               "recorded_ms": int(time.time() * 1000)}
        if self._batch is not None and self._batch.rows is not None:
            self._batch.rows.append(row)
        else:
            ensure_table(self.uri, HISTORY_SCHEMA)
            write_table(self.uri, pa.Table.from_pylist([row], schema=HISTORY_SCHEMA),
                        mode="append")
        entry = Entry(int(lsn), int(ordinal), shape)
        keys = [(e.lsn, e.ordinal) for e in entries]
        entries.insert(bisect.bisect_right(keys, (entry.lsn, entry.ordinal)), entry)
        return True
