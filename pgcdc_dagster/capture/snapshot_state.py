"""Durable snapshot progress: an append-only Delta table per slot.

``<lakehouse>/_pgcdc/<slot>/snapshot/progress`` holds one row per event of a snapshot run:

========== ==================================================================================
event      payload (JSON)
========== ==================================================================================
start      ``{"mode", "reason", "tables": [[schema, table], ...]}``
plan       one per table: ``{"kind": "key"|"ctid", "chunks": [...], "est_rows", "override"}``
chunk      one per chunk read: ``lsn`` = the point it was read at, ``rows``, and the bronze
           and silver files the task wrote (not yet in the tables' logs)
table_done one per table once its bronze and silver commits are made
vanished   a table that disappeared while it was being read
done       the snapshot finished
abandoned  the snapshot can no longer be finished (its slot was lost or dropped)
========== ==================================================================================

A table's rows enter bronze and silver only in its final commits (bronze append, silver
overwrite), so a reader never sees half a snapshot; the chunk rows here are what makes an
interrupted snapshot resumable without reading the finished chunks again. The final commits
carry an app transaction ``(<prefix>:snapshot:<schema>.<table>, snapshot id)``, so a crash
between those commits and the ``table_done`` row never commits a table twice.
Delta (rather than a JSON file) gives atomic appends on object stores too, and the table can
be queried like any other to watch a snapshot.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.lake.delta import open_table, write_table
from pgcdc_dagster.lake.paths import slot_root
from pgcdc_dagster.postgres.snapshot_read import Chunk
from pgcdc_dagster.spark.snapshot_tasks import SnapshotFile

PROGRESS_SCHEMA = pa.schema([
    pa.field("snapshot_id", pa.int64(), nullable=False),
    pa.field("event", pa.string(), nullable=False),
    pa.field("schema", pa.string()),
    pa.field("table", pa.string()),
    pa.field("chunk", pa.int32()),
    pa.field("lsn", pa.int64()),
    pa.field("rows", pa.int64()),
    pa.field("payload", pa.string()),
    pa.field("ts_ms", pa.int64(), nullable=False),
])

TableName = tuple[str, str]


def progress_uri(lakehouse: str, slot: str) -> str:
    """Where the progress table of a capture (slot) lives."""
    return f"{slot_root(lakehouse, slot)}/snapshot/progress"


@dataclass
class TablePlan:
    """How one table is split; fixed once written, so resumed runs read the same ranges."""

    schema: str
    table: str
    kind: str
    chunks: list[Chunk]
    est_rows: int
    override: bool = False
    fingerprint: str = ""
    """Hash of the bronze and silver schemas the chunks were written with."""
    plan_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Chunk rows name the plan they belong to; a table planned again starts afresh."""
    key: list[str] = field(default_factory=list)
    """The key columns the ranges are over (they must still be the key to resume)."""

    @property
    def name(self) -> TableName:
        return (self.schema, self.table)

    def payload(self) -> dict[str, Any]:
        return {"kind": self.kind, "chunks": [c.to_json() for c in self.chunks],
                "est_rows": self.est_rows, "override": self.override,
                "fingerprint": self.fingerprint, "plan_id": self.plan_id, "key": self.key}

    @classmethod
    def from_payload(cls, schema: str, table: str, data: dict[str, Any]) -> TablePlan:
        return cls(schema, table, str(data["kind"]),
                   [Chunk.from_json(schema, table, c) for c in data["chunks"]],
                   int(data.get("est_rows", -1)), bool(data.get("override", False)),
                   str(data.get("fingerprint", "")), str(data.get("plan_id", "")),
                   [str(k) for k in data.get("key", [])])


@dataclass(frozen=True)
class ChunkDone:
    """A chunk read and written (its files are not yet committed to the tables)."""

    index: int
    lsn: int
    rows: int
    bronze: SnapshotFile | None
    silver: tuple[SnapshotFile, ...]
    """Its silver files (several when laid out at the target file size)."""


@dataclass(frozen=True)
class TableDone:
    """A table whose bronze and silver commits are made."""

    name: TableName
    lsn: int
    rows: int
    bronze_version: int
    silver_version: int


@dataclass
class SnapshotState:
    """Everything recorded about one snapshot run, as read back from the progress table."""

    snapshot_id: int
    mode: str
    tables: list[TableName]
    plans: dict[TableName, TablePlan] = field(default_factory=dict)
    chunks: dict[TableName, dict[int, ChunkDone]] = field(default_factory=dict)
    committed: set[TableName] = field(default_factory=set)
    vanished: set[TableName] = field(default_factory=set)
    finished: bool = False
    abandoned: bool = False

    @property
    def open(self) -> bool:
        """Started and neither finished nor abandoned: it must be resumed."""
        return not self.finished and not self.abandoned


def _event(snapshot_id: int, event: str, name: TableName | None = None, *,
           chunk: int | None = None, lsn: int | None = None, rows: int | None = None,
           payload: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"snapshot_id": snapshot_id, "event": event,
            "schema": None if name is None else name[0],
            "table": None if name is None else name[1], "chunk": chunk, "lsn": lsn,
            "rows": rows, "payload": None if payload is None else json.dumps(payload),
            "ts_ms": int(time.time() * 1000)}


class SnapshotLog:
    """Appends progress events and reads back the latest snapshot's state."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def _append(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            write_table(self.uri, pa.Table.from_pylist(list(rows), schema=PROGRESS_SCHEMA),
                        mode="append")

    def start(self, snapshot_id: int, mode: str, reason: str,
              plans: Sequence[TablePlan]) -> None:
        """Record a new snapshot and its table plans (one atomic append)."""
        names = [[p.schema, p.table] for p in plans]
        rows = [_event(snapshot_id, "start", payload={"mode": mode, "reason": reason,
                                                      "tables": names})]
        rows += [_event(snapshot_id, "plan", p.name, payload=p.payload()) for p in plans]
        self._append(rows)

    def add_plans(self, snapshot_id: int, plans: Sequence[TablePlan]) -> None:
        """Add tables to a snapshot being resumed."""
        self._append([_event(snapshot_id, "plan", p.name, payload=p.payload()) for p in plans])

    def chunks_done(self, snapshot_id: int,
                    done: Iterable[tuple[TablePlan, ChunkDone]]) -> None:
        """Record finished chunks (one atomic append for the batch)."""
        self._append([
            _event(snapshot_id, "chunk", plan.name, chunk=c.index, lsn=c.lsn, rows=c.rows,
                   payload={"plan_id": plan.plan_id,
                            "bronze": None if c.bronze is None else c.bronze.to_json(),
                            "silver": [f.to_json() for f in c.silver]})
            for plan, c in done])

    def table_done(self, snapshot_id: int, name: TableName, lsn: int, rows: int,
                   bronze_version: int, silver_version: int) -> None:
        self.tables_done(snapshot_id, [TableDone(name, lsn, rows, bronze_version,
                                                 silver_version)])

    def tables_done(self, snapshot_id: int, done: Iterable[TableDone]) -> None:
        """Record committed tables (one atomic append for the batch)."""
        self._append([_event(snapshot_id, "table_done", t.name, lsn=t.lsn, rows=t.rows,
                             payload={"bronze_version": t.bronze_version,
                                      "silver_version": t.silver_version}) for t in done])

    def vanished(self, snapshot_id: int, name: TableName, message: str) -> None:
        self._append([_event(snapshot_id, "vanished", name, payload={"message": message})])

    def finish(self, snapshot_id: int, event: str = "done", reason: str = "") -> None:
        """Close the snapshot: ``done``, or ``abandoned`` with the reason."""
        self._append([_event(snapshot_id, event, payload={"reason": reason})])

    def load_open(self) -> SnapshotState | None:
        """The latest snapshot's state when it is open (to be resumed), else None. A closed
        one is recognised from two columns, without parsing its rows: a run with nothing to
        snapshot pays no row per table of the last snapshot."""
        table = open_table(self.uri)
        if table is None:
            return None
        data = table.to_pyarrow_table(columns=["snapshot_id", "event"])
        if data.num_rows == 0:
            return None
        ids = data.column("snapshot_id")
        latest = pc.equal(ids, pc.max(ids))
        closed = pc.and_(latest, pc.is_in(data.column("event"),
                                          value_set=pa.array(["done", "abandoned"])))
        if pc.any(closed).as_py():
            return None
        state = self.load()
        return state if state is not None and state.open else None

    def load(self) -> SnapshotState | None:
        """The latest snapshot's state (None when no snapshot was ever recorded)."""
        table = open_table(self.uri)
        if table is None:
            return None
        data = table.to_pyarrow_table()
        if data.num_rows == 0:
            return None
        latest = max(data.column("snapshot_id").to_pylist())
        rank = {"start": 0, "plan": 1}  # then the rest; plans of one table in time order
        rows = sorted((r for r in data.to_pylist() if r["snapshot_id"] == latest),
                      key=lambda r: (rank.get(r["event"], 2), r["ts_ms"]))
        if not rows or rows[0]["event"] != "start":
            return None
        head = json.loads(rows[0]["payload"])
        state = SnapshotState(latest, str(head.get("mode", "")),
                              [(str(n[0]), str(n[1])) for n in head.get("tables", [])])
        for row in rows[1:]:
            payload = json.loads(row["payload"]) if row["payload"] else {}
            name = (row["schema"], row["table"])
            event = row["event"]
            if event == "plan":
                state.plans[name] = TablePlan.from_payload(name[0], name[1], payload)
                if name not in state.tables:
                    state.tables.append(name)
            elif event == "chunk":
                plan = state.plans.get(name)
                if plan is None or payload.get("plan_id") != plan.plan_id:
                    continue
                bronze = payload.get("bronze")
                silver = payload.get("silver") or []
                done = ChunkDone(int(row["chunk"]), int(row["lsn"]), int(row["rows"]),
                                 None if bronze is None else SnapshotFile.from_json(bronze),
                                 tuple(SnapshotFile.from_json(f) for f in (
                                     silver if isinstance(silver, list) else [silver])))
                known = state.chunks.setdefault(name, {})
                if done.index not in known or known[done.index].lsn < done.lsn:
                    known[done.index] = done  # a chunk read again later supersedes
            elif event == "table_done":
                state.committed.add(name)
            elif event == "vanished":
                state.vanished.add(name)
            elif event == "done":
                state.finished = True
            elif event == "abandoned":
                state.abandoned = True
        return state

