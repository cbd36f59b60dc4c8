"""Dagster's default SQLite event storage, kept cheap while a run reports many events.

The default instance (``storage: sqlite``, what a fresh ``DAGSTER_HOME`` gets) keeps each
run's events in a SQLite file of its own and mirrors asset events and check evaluations into
an index file. It opens a new connection for every write and closes it after the commit; in
WAL mode the last connection to close a database checkpoints the WAL into it and deletes it,
so every event paid a checkpoint (more writes and fsyncs) on top of its commit: four of them
per table for an initial snapshot of many tables, more than half of the run (issue 16).

:func:`event_files_held` holds one idle connection on the run's file and on the index file
while the capture op reports its tables: no write's connection is then the last to close,
and SQLite checkpoints the WAL as it grows (every 1,000 pages, its automatic checkpoint)
instead of at every event. The events, their order and what readers see are unchanged (the
connection reads nothing and holds no transaction, so it blocks neither writers nor
checkpoints). Measured on this project's machine kind: 38-56 ms per materialization event
without, 21-26 ms with (load 9). Any other event storage (PostgreSQL, MySQL, Dagster+) is
left alone, and a file that cannot be opened is simply not held.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SqliteEventLogStorage,
)

log = logging.getLogger(__name__)


@contextlib.contextmanager
def event_files_held(instance: dg.DagsterInstance, run_id: str) -> Iterator[int]:
    """Within the block, the run's event file and the index file stay open (on the default
    SQLite event storage); yields how many files are held (0 for any other storage)."""
    storage = instance.event_log_storage
    held: list[sqlite3.Connection] = []
    if isinstance(storage, SqliteEventLogStorage):
        for shard in (run_id, INDEX_SHARD_NAME):
            path = Path(storage.path_for_shard(shard))
            try:
                # mode=rw: never create a file Dagster has not made.
                conn = sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True, timeout=5)
            except sqlite3.Error as exc:
                log.debug("event file %s not held: %s", path, exc)
                continue
            held.append(conn)
            try:  # a first read opens the WAL; no transaction stays open (nothing written)
                conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            except sqlite3.Error as exc:
                log.debug("event file %s not held: %s", path, exc)
                held.pop().close()
    try:
        yield len(held)
    finally:
        for conn in held:
            conn.close()
