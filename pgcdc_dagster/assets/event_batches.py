"""Several asset events committed in one SQLite transaction (issue 16).

On the default SQLite event storage each event is two to four writes, each its own
transaction on a new connection, each commit an fsync of the WAL. Within a :class:`Batch`
(see :func:`assets.event_storage.event_files_held`) the run's event file and the index are
written through one connection each, kept for the block, and their transactions span several
events:

* a transaction starts with ``BEGIN IMMEDIATE`` (the file's write lock taken at once, waiting
  at most Dagster's busy timeout like any write), so a write never meets a snapshot another
  process has made stale;
* each of Dagster's ``_connect`` blocks inside it is a SAVEPOINT: when Dagster's code raises,
  only its own writes are undone, as its own transaction would be (a block that runs a single
  statement, ``atomic``, needs none: SQLite undoes a failed statement alone; see
  :mod:`assets.event_writes`);
* the transactions are committed (the run's file first, then the index, the order Dagster
  writes them in) after :data:`BATCH_EVENTS` events of the block's run, when the oldest
  uncommitted write is :data:`BATCH_SECONDS` old (at the next event, or by a thread of the
  block that looks every quarter of that time), right after any event that is not an asset
  materialization or check evaluation of the block's run (a log line, an observation, a step
  event: they and everything before them are on disk when ``store_event`` returns), after a
  failed ``store_event``, and at the end of the block, also when it raised;
* a read in this process goes through the same connection and sees the events not yet
  committed; a read that finds nothing pending commits its empty transaction at once, so the
  write lock is not held for it.

Other processes (the webserver, a sensor, a second run) therefore see a materialization or a
check evaluation at most :data:`BATCH_SECONDS` (plus a quarter) after it was logged, always
in order and never half of one; while a transaction is open they wait for the lock to write
to the same file (the index: at most that long; SQLite's busy timeout, Dagster's 30 s, is far
longer). The steps of a multi-process asset run, each in its block, take turns at the run's
file the same way; no process waits for a lock while holding one another waits for (each
batch opens the run's file before the index and commits both together). A crash of the
process (SIGKILL, power loss) loses the events of the open transactions: at most
:data:`BATCH_EVENTS` materializations and check evaluations, whose data is already
committed. The capture does not depend on them: the run is marked failed, after which the
next capture run catches every silver up; a lean run's LSN range is an observation
(committed at once); checks are evaluated again by the next run or sweep. One check reads
them: ``lsn_windows_contiguous`` chains asset-job and incremental-snapshot runs by the
ranges on their bronze materializations; a crash while such a run reports loses the ranges
of the tables not reported yet on Dagster's own path too, and with a batch up to
:data:`BATCH_EVENTS` more, for which the check then reports a gap, as after any such crash.
A commit that fails is raised by the next write or at the end of the block, naming the
events it lost.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
import sqlalchemy as sa
from dagster._core.events.log import EventLogEntry
from sqlalchemy.pool import NullPool

log = logging.getLogger(__name__)

BATCH_EVENTS = 50
"""Asset materializations and check evaluations of the block's run per transaction, at most."""
BATCH_SECONDS = 0.2
"""Age of the oldest uncommitted write at which the flusher commits."""
BATCHED = frozenset({dg.DagsterEventType.ASSET_MATERIALIZATION,
                     dg.DagsterEventType.ASSET_CHECK_EVALUATION})
"""The events a batch may hold uncommitted; any other is committed when stored."""


def batch_engine(url: str, timeout: float) -> sa.Engine:
    """An engine whose transactions start with ``BEGIN IMMEDIATE`` and whose savepoints work
    (pysqlite's own transaction handling off: SQLAlchemy's documented recipe)."""
    engine = sa.create_engine(url, poolclass=NullPool,
                              connect_args={"timeout": timeout, "check_same_thread": False})

    @sa.event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @sa.event.listens_for(engine, "begin")
    def _begin_immediate(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


class BatchCommitFailed(RuntimeError):
    """A batch's commit failed: its events were not stored."""


class Batch:
    """The held connections and open transactions of one block (run file and index).

    :meth:`connect` runs under the storage's ``_db_lock`` (Dagster's ``_connect`` takes it);
    :meth:`stored` and the flusher take that lock themselves."""

    def __init__(self, run_id: str, shards: dict[str, sa.Engine],
                 db_lock: Any) -> None:
        self._run_id = run_id
        self._engines = shards  # in commit order: the run's file, then the index
        self._lock = db_lock
        self._conns: dict[str, sa.Connection] = {}
        self._txs: dict[str, sa.RootTransaction] = {}
        self._changes: dict[str, int] = {}
        self._pending = 0
        self._since: float | None = None
        self._failed: BaseException | None = None
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_when_old, daemon=True,
                                         name="pgcdc-event-batch")
        self._flusher.start()

    def covers(self, shard: str) -> bool:
        return shard in self._engines

    @contextlib.contextmanager
    def connect(self, shard: str, atomic: bool = False) -> Iterator[sa.Connection]:
        """Dagster's ``_connect`` for a covered shard (the caller holds ``_db_lock``);
        ``atomic``: the block runs one statement, which SQLite undoes alone when it fails
        (no savepoint needed)."""
        self._raise_failed()
        conn = self._conns.get(shard)
        if conn is None:
            conn = self._conns[shard] = self._engines[shard].connect()
        if shard not in self._txs:
            self._txs[shard] = conn.begin()  # waits for the lock up to the busy timeout
            self._changes[shard] = self._total_changes(conn)
            if self._since is None:
                self._since = time.monotonic()
        if atomic:
            yield conn
        else:
            raw: Any = conn.connection.dbapi_connection
            raw.execute("SAVEPOINT pgcdc_event")  # the driver's own: cheaper than SQLAlchemy's
            try:
                yield conn
            except BaseException:
                raw.execute("ROLLBACK TO pgcdc_event")
                raw.execute("RELEASE pgcdc_event")
                raise
            raw.execute("RELEASE pgcdc_event")
        if self._pending == 0 and not any(self._total_changes(self._conns[s]) != changes
                                          for s, changes in self._changes.items()):
            self._commit()  # a read with nothing pending: the write lock is not kept for it

    @staticmethod
    def _total_changes(conn: sa.Connection) -> int:
        """Rows the connection has changed since it opened (sqlite3's own count)."""
        raw: Any = conn.connection.dbapi_connection
        return int(raw.total_changes)

    def stored(self, event: EventLogEntry, ok: bool) -> None:
        """After Dagster's ``store_event`` of ``event`` (``ok``: it returned)."""
        with self._lock:
            if not self._txs:
                return
            self._pending += 1
            if not ok or event.run_id != self._run_id or \
                    event.dagster_event_type not in BATCHED or \
                    self._pending >= BATCH_EVENTS or self._old():
                self._commit()

    def _old(self) -> bool:
        return self._since is not None and time.monotonic() - self._since >= BATCH_SECONDS

    def _commit(self) -> None:
        """Commit the open transactions (the caller holds ``_db_lock``)."""
        pending, self._pending, self._since = self._pending, 0, None
        txs, self._txs, self._changes = self._txs, {}, {}
        try:
            for tx in txs.values():
                tx.commit()
        except BaseException as exc:
            for tx in txs.values():
                with contextlib.suppress(Exception):
                    if tx.is_active:
                        tx.rollback()
            raise BatchCommitFailed(
                f"{pending} Dagster event(s) of run {self._run_id} were not stored (or only "
                f"in the run's own file): the commit of their batch failed "
                f"({type(exc).__name__}: {exc}); the run's materializations and check "
                "evaluations since the previous commit are missing from the event log"
            ) from exc

    def _raise_failed(self) -> None:
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed

    def _flush_when_old(self) -> None:
        while not self._stop.wait(BATCH_SECONDS / 4):
            with self._lock:
                if self._old():
                    try:
                        self._commit()
                    except BatchCommitFailed as exc:  # raised by the next write, or close
                        log.warning("event batch commit failed", exc_info=True)
                        self._failed = exc

    def close(self) -> None:
        """Commit what is pending, release the files (also when the block raised)."""
        self._stop.set()
        self._flusher.join()
        try:
            with self._lock:
                try:
                    if self._txs:
                        self._commit()
                    self._raise_failed()
                finally:
                    for conn in self._conns.values():
                        with contextlib.suppress(Exception):
                            conn.close()
                    self._conns.clear()
        finally:
            for engine in self._engines.values():
                engine.dispose()
