"""Durable incremental-snapshot progress: one small JSON file per table.

``<lakehouse>/_pgcdc/<slot>/incremental/<schema>.<table>.json`` (names escaped as path
segments with every ``.`` escaped too, ``lake/paths.py``; a name too long for a file name is
replaced by its SHA-256) holds the snapshot id, the
chunk cursor (the ordering key of the last chunk whose rows are committed to bronze), the
key the snapshot ends at, counters, the status (running / paused / stopped / done) and the
chunk whose rows were handed to a bronze window but not yet known to be committed
(``pending``). On resume, a pending chunk counts as committed when the table's bronze
app-transaction version (the end of its last committed window) lies beyond the chunk's high
watermark; otherwise it is read again. Files are replaced atomically (locally write +
rename; on object storage one PUT).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from pgcdc_dagster.lake.paths import encode_segment, slot_root
from pgcdc_dagster.lake.storage import join, list_names, read_bytes, write_bytes

STATUSES = ("running", "paused", "stopped", "done")


@dataclass
class TableProgress:
    """One table's incremental snapshot."""

    snapshot_id: str
    table: str
    """``schema.table`` (for messages and watermarks; :attr:`qualified` is the name)."""
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
    name: list[str] | None = None
    """``[schema, table]`` (a name may hold dots; files written before it was recorded
    have None, and their ``table`` splits at its first dot)."""

    @property
    def qualified(self) -> tuple[str, str]:
        if self.name is not None:
            return self.name[0], self.name[1]
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
    return join(slot_root(lakehouse, slot), "incremental")


_NAME_MAX = 255
"""Bytes in a file name (ext4, XFS, APFS)."""


def state_file(schema: str, table: str) -> str:
    """The progress file's name: ``<schema>.<table>.json``, each name a path segment with
    its dots escaped (so the file name is injective); two escaped 63-byte names can exceed
    255 bytes, and such a table's file is named by the SHA-256 of the two names."""
    name = f"{encode_segment(schema, escape_dots=True)}.{encode_segment(table, escape_dots=True)}"
    if len(name.encode()) + len(".json") > _NAME_MAX:
        digest = hashlib.sha256(json.dumps([schema, table]).encode()).hexdigest()
        name = f"~sha256-{digest}"
    return name + ".json"


class ProgressStore:
    """The progress files of one slot, on local disk or object storage
    (:mod:`pgcdc_dagster.lake.storage`)."""

    def __init__(self, lakehouse: str, slot: str) -> None:
        self.dir = state_dir(lakehouse, slot)

    def _path(self, schema: str, table: str) -> str:
        return join(self.dir, state_file(schema, table))

    def save(self, progress: TableProgress) -> None:
        write_bytes(self._path(*progress.qualified),
                    json.dumps(asdict(progress), sort_keys=True).encode())

    def load(self, schema: str, table: str) -> TableProgress | None:
        data = read_bytes(self._path(schema, table))
        return None if data is None else TableProgress(**json.loads(data))

    def all(self) -> list[TableProgress]:
        found = []
        for name in list_names(self.dir, ".json"):
            data = read_bytes(join(self.dir, name))
            if data is not None:
                found.append(TableProgress(**json.loads(data)))
        return found
