"""Durable incremental-snapshot progress: one small JSON file per table.

``<lakehouse>/_pgcdc/<slot>/incremental/<schema>.<table>.json`` holds the snapshot id, the
chunk cursor (the ordering key of the last chunk whose rows are committed to bronze), the
key the snapshot ends at, counters, the status (running / paused / stopped / done) and the
chunk whose rows were handed to a bronze window but not yet known to be committed
(``pending``). On resume, a pending chunk counts as committed when the table's bronze
app-transaction version (the end of its last committed window) lies beyond the chunk's high
watermark; otherwise it is read again. Files are replaced atomically (locally write +
rename; on object storage one PUT).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from typing import Any

from pgcdc_dagster.lake.paths import normalise_root
from pgcdc_dagster.lake.storage import join, list_names, read_bytes, write_bytes

STATUSES = ("running", "paused", "stopped", "done")


@dataclass
class TableProgress:
    """One table's incremental snapshot."""

    snapshot_id: str
    table: str
    """``schema.table``."""
    chunk_size: int
    condition: str | None = None
    surrogate_key: str | None = None
    signal_id: str | None = None
    status: str = "running"
    max_key: list[str | None] | None = None
    last_key: list[str | None] | None = None
    chunks_done: int = 0
    rows_read: int = 0
    rows_emitted: int = 0
    rows_dropped: int = 0
    rows_early: int = 0
    estimated_rows: int = 0
    started_at: float = field(default_factory=time.time)
    seconds: float = 0.0
    planned: bool = False
    """``max_key`` has been read (the snapshot's end is fixed)."""
    pending: dict[str, Any] | None = None
    """``{"chunk", "hw_commit_lsn", "last_key", "rows", "emitted", "dropped", "early",
    "final"}`` of a chunk handed to a bronze window whose commit is not yet confirmed."""

    @property
    def qualified(self) -> tuple[str, str]:
        schema, _, table = self.table.partition(".")
        return schema, table

    @property
    def chunks_total(self) -> int:
        """Estimate: chunks done plus the rows still expected, in chunks."""
        left = max(self.estimated_rows - self.rows_read, 0)
        return self.chunks_done + (0 if self.status == "done" else
                                   max(1, -(-left // max(self.chunk_size, 1))))

    def confirm_pending(self) -> None:
        """The pending chunk's rows are committed: move the cursor past it."""
        p = self.pending
        if p is None:
            return
        self.last_key = p["last_key"]
        self.chunks_done += 1
        self.rows_read += int(p["rows"])
        self.rows_emitted += int(p["emitted"])
        self.rows_dropped += int(p["dropped"])
        self.rows_early += int(p["early"])
        if p.get("final"):
            self.status = "done"
        self.pending = None


def state_dir(lakehouse: str, slot: str) -> str:
    """Where a slot's progress files live (a local directory or an object-store prefix)."""
    return join(normalise_root(lakehouse), "_pgcdc", slot, "incremental")


class ProgressStore:
    """The progress files of one slot, on local disk or object storage
    (:mod:`pgcdc_dagster.lake.storage`)."""

    def __init__(self, lakehouse: str, slot: str) -> None:
        self.dir = state_dir(lakehouse, slot)

    def _path(self, table: str) -> str:
        return join(self.dir, urllib.parse.quote(table, safe="") + ".json")

    def save(self, progress: TableProgress) -> None:
        write_bytes(self._path(progress.table),
                    json.dumps(asdict(progress), sort_keys=True).encode())

    def load(self, table: str) -> TableProgress | None:
        data = read_bytes(self._path(table))
        return None if data is None else TableProgress(**json.loads(data))

    def all(self) -> list[TableProgress]:
        found = []
        for name in list_names(self.dir, ".json"):
            data = read_bytes(join(self.dir, name))
            if data is not None:
                found.append(TableProgress(**json.loads(data)))
        return found
