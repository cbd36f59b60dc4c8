"""Snapshot progress as the engine reports it: rows read, chunks done, rows/s and ETA."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class SnapshotProgress:
    """One progress report, sent after each chunk."""

    snapshot_id: int
    table: str
    """The table of the chunk that just finished."""
    chunks_done: int
    chunks_total: int
    rows: int
    """Rows read so far, chunks read by earlier (interrupted) runs included."""
    est_rows: int
    """Estimated rows of the whole snapshot (``pg_class.reltuples``; -1 when unknown)."""
    rows_per_second: float
    """Rate of this run."""
    eta_seconds: float | None
    seconds: float

    def message(self) -> str:
        """The log line."""
        eta = "?" if self.eta_seconds is None else f"{self.eta_seconds:.0f}s"
        total = f"/~{self.est_rows:,}" if self.est_rows > 0 else ""
        return (f"snapshot {self.snapshot_id}: {self.chunks_done}/{self.chunks_total} chunks, "
                f"{self.rows:,}{total} rows, {self.rows_per_second:,.0f} rows/s, ETA {eta} "
                f"(last: {self.table})")

    def metadata(self) -> dict[str, float | int | str]:
        """The same as flat values (Dagster metadata)."""
        return {"snapshot_chunks_done": self.chunks_done,
                "snapshot_chunks_total": self.chunks_total, "snapshot_rows_read": self.rows,
                "snapshot_rows_per_second": round(self.rows_per_second, 1),
                "snapshot_eta_seconds": -1 if self.eta_seconds is None else
                round(self.eta_seconds, 1)}


class ProgressTracker:
    """Accumulates finished chunks and produces :class:`SnapshotProgress` reports."""

    def __init__(self, snapshot_id: int, chunks_total: int, est_rows: int, *,
                 chunks_done: int = 0, rows_done: int = 0) -> None:
        self.snapshot_id = snapshot_id
        self.chunks_total = chunks_total
        self.est_rows = est_rows
        self.chunks_done = chunks_done
        self.rows = rows_done
        self.rows_this_run = 0
        self.started = time.monotonic()

    def add(self, table: str, rows: int) -> SnapshotProgress:
        self.chunks_done += 1
        self.rows += rows
        self.rows_this_run += rows
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.rows_this_run / elapsed
        eta: float | None = None
        if self.chunks_done >= self.chunks_total:
            eta = 0.0
        elif rate > 0 and self.est_rows > self.rows:
            eta = (self.est_rows - self.rows) / rate
        elif self.chunks_done:
            done_this_run = max(self.chunks_done, 1)
            eta = elapsed / done_this_run * (self.chunks_total - self.chunks_done)
        return SnapshotProgress(self.snapshot_id, table, self.chunks_done, self.chunks_total,
                                self.rows, self.est_rows, rate, eta, elapsed)
