"""Dagster's event storage (default SQLite, or PostgreSQL) kept cheap while a run reports many
events.

The default instance (``storage: sqlite``, what a fresh ``DAGSTER_HOME`` gets) keeps each
run's events in a SQLite file of its own and mirrors asset events and check evaluations into
an index file. For every write it creates a new SQLAlchemy engine (so each statement is
compiled afresh: the compiled-statement cache lives on the engine), opens a connection,
commits and closes it; and in WAL mode the last connection to close a database checkpoints
the WAL into it and deletes it. An initial snapshot reports four events per table and the
``capture_checks`` sweep three per table, each several writes (issue 16).

:func:`event_files_held`, around the ops that report many events, does on that storage:

* it holds one idle connection on the run's file and on the index file, so no write's
  connection is the last to close: SQLite checkpoints the WAL as it grows (every 1,000 pages,
  its automatic checkpoint) instead of at every event;
* it makes the storage keep one engine per file for the block (:class:`SharedEngines`), with
  Dagster's busy timeout and first-use schema set-up, under the storage's lock as Dagster's
  own ``_connect``. The storage's ``has_table`` (asked once per check evaluation) and its
  check of the asset key table's index columns (once per materialization) answer from what
  they found earlier in the block when that was *present*; an absent table is asked again;
* the writes to the run's file and to the index go through one connection per file, kept
  for the block, and the run's asset materializations and check evaluations are committed
  in batches (:class:`assets.event_batches.Batch`: at most 50 events or 0.2 s; any other
  event, a failed write and the block's end commit at once);
* each event is serialized once while it is stored, not two or three times
  (:mod:`assets.event_memo`).

On dagster-postgres's event storage (``dagster.yaml.example``), which connects to PostgreSQL
for every write (its engine's ``NullPool``), it keeps one connection for the block
(:func:`postgres_connection_kept`: the engine dagster-postgres builds for its webserver, with
the same URL, token provider and ``AUTOCOMMIT`` isolation), serializes each event once and
keeps the table-existence and index-column answers once found (:class:`KeptAnswers`); each
write is still committed when it is made there. Any other storage (MySQL, Dagster+,
in-memory) is left alone.

The events, their order and their content are unchanged. On PostgreSQL every write is
committed before ``log_event`` returns. On SQLite this process reads its own writes at once
(its reads go through the same connections) while other processes (the webserver, a sensor,
a second run) see a batched materialization or check evaluation at most 0.25 s after it was
logged, in order; a crash loses the open batch (see :mod:`assets.event_batches` for what
reads those events). After the block the storage's own methods and engine are back (even
when the block raised), everything pending is committed and the files are released.

Dagster's private names relied on (``dagster`` 1.13.27, pinned; checked before use, and when
any is missing or a subclass overrides a method, the storage is left to Dagster's own path):
the class ``SqliteEventLogStorage`` and ``INDEX_SHARD_NAME`` of
``dagster._core.storage.event_log.sqlite.sqlite_event_log`` and that module's
``SQLITE_BUSY_TIMEOUT_SECONDS``; the storage's methods ``path_for_shard``,
``conn_string_for_shard``, ``_connect``, ``_initdb``, ``has_table``,
``_has_asset_key_index_cols_on_connection`` and ``store_event`` (replaced for the block by
instance attributes, which Python looks up before the class's methods) and its attributes
``_db_lock`` and ``_initialized_dbs``; on PostgreSQL, ``PostgresEventLogStorage`` (the exact
class) and its attributes ``_engine`` (replaced for the block when it is a ``NullPool``
engine), ``postgres_url`` and ``_token_provider``, its methods ``has_table``,
``_has_asset_key_index_cols_on_connection`` and ``store_event`` (replaced the same way),
and ``dagster_postgres.utils.create_pg_engine``; for the serialization, the names
:mod:`assets.event_memo` lists.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import dagster._check as check
import sqlalchemy as sa
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.sqlite import sqlite_event_log
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SqliteEventLogStorage,
)
from sqlalchemy.pool import NullPool

from pgcdc_dagster.assets.event_batches import Batch, batch_engine
from pgcdc_dagster.assets.event_memo import memo_installed, serialized_once
from pgcdc_dagster.assets.event_writes import PreparedWrites, prepared_writes_usable

log = logging.getLogger(__name__)

REPLACED = ("_connect", "has_table", "_has_asset_key_index_cols_on_connection", "store_event")
"""The storage methods :class:`SharedEngines` replaces for the block."""
_USED = ("_initdb", "conn_string_for_shard", "path_for_shard")
"""The storage methods it calls."""


def _busy_timeout() -> float | None:
    value = getattr(sqlite_event_log, "SQLITE_BUSY_TIMEOUT_SECONDS", None)
    return float(value) if isinstance(value, int | float) else None


def engines_shareable(storage: object) -> bool:
    """Whether ``storage`` is Dagster's own SQLite event storage with every private name
    :class:`SharedEngines` relies on, none of them overridden by a subclass."""
    if not isinstance(storage, SqliteEventLogStorage) or _busy_timeout() is None:
        return False
    cls = type(storage)
    for name in (*REPLACED, *_USED):
        ours = getattr(SqliteEventLogStorage, name, None)
        if not callable(ours) or getattr(cls, name, None) is not ours:
            return False
    if any(name in vars(storage) for name in REPLACED):
        return False  # replaced already (an enclosing block, or someone else): leave it
    return isinstance(getattr(storage, "_initialized_dbs", None), set) and \
        hasattr(getattr(storage, "_db_lock", None), "__enter__")


class KeptAnswers:
    """A storage's ``has_table`` (asked once per check evaluation) and its check of the asset
    key table's index columns (once per materialization; several catalog queries on
    PostgreSQL) answered from what they found earlier in the block when that was *present*
    (an absent table is asked again); its ``store_event`` with each event serialized once
    (:mod:`assets.event_memo`) when ``memo``."""

    def __init__(self, storage: Any, memo: bool) -> None:
        self._storage = storage
        self._memo = memo
        self._tables: set[str] = set()
        self._index_cols = False

    def _ask_table(self, table_name: str) -> bool:
        return bool(type(self._storage).has_table(self._storage, table_name))

    def has_table(self, table_name: str) -> bool:
        if table_name in self._tables:
            return True
        found = self._ask_table(table_name)
        if found:
            self._tables.add(table_name)
        return found

    def has_asset_key_index_cols(self, conn: sa.Connection) -> bool:
        """The asset key table's index columns, asked on ``conn`` until found once."""
        if not self._index_cols:
            self._index_cols = bool(
                type(self._storage)._has_asset_key_index_cols_on_connection(self._storage, conn))
        return self._index_cols

    def store_event(self, event: EventLogEntry) -> None:
        with serialized_once(event) if self._memo else contextlib.nullcontext():
            type(self._storage).store_event(self._storage, event)


class SharedEngines(KeptAnswers):
    """Dagster's SQLite ``_connect`` with one engine per shard for the block's duration.

    Same ``_db_lock``, same busy timeout, same ``_initdb`` on a shard's first use. Given
    ``batch_run``, that run's file and the index are written through the batch's kept
    connections (:class:`assets.event_batches.Batch`); any other shard as Dagster does, a
    connection per write (``NullPool``: opened for the write, closed after its commit)."""

    def __init__(self, storage: SqliteEventLogStorage, batch_run: str | None = None,
                 memo: bool = False, prepared: bool = True) -> None:
        super().__init__(storage, memo)
        self._engines: dict[str, sa.Engine] = {}
        self._engines_lock = threading.Lock()  # has_table runs outside the storage's lock
        self._timeout = _busy_timeout()
        self.batch: Batch | None = None
        if batch_run is not None:
            timeout = self._timeout if self._timeout is not None else 30.0
            self.batch = Batch(batch_run, {
                shard: batch_engine(storage.conn_string_for_shard(shard), timeout)
                for shard in (batch_run, INDEX_SHARD_NAME)}, storage._db_lock)
        self._writes = PreparedWrites(storage, self.connect) \
            if prepared and prepared_writes_usable(storage) else None

    def engine(self, shard: str) -> sa.Engine:
        with self._engines_lock:
            engine = self._engines.get(shard)
            if engine is None:
                engine = sa.create_engine(self._storage.conn_string_for_shard(shard),
                                          poolclass=NullPool,
                                          connect_args={"timeout": self._timeout})
                self._engines[shard] = engine
            return engine

    @contextlib.contextmanager
    def connect(self, shard: str, atomic: bool = False) -> Iterator[sa.Connection]:
        """``SqliteEventLogStorage._connect`` with the shard's engine kept (``atomic``: the
        block runs one statement, :meth:`assets.event_batches.Batch.connect`)."""
        storage: Any = self._storage
        with storage._db_lock:
            check.str_param(shard, "shard")
            engine = self.engine(shard)
            if shard not in storage._initialized_dbs:
                storage._initdb(engine)
                storage._initialized_dbs.add(shard)
            if self.batch is not None and self.batch.covers(shard):
                with self.batch.connect(shard, atomic) as conn:
                    yield conn
                return
            with engine.connect() as conn, conn.begin():
                yield conn

    def store_event(self, event: EventLogEntry) -> None:
        """Dagster's ``store_event``, the event serialized once (:mod:`assets.event_memo`)
        and its writes committed with the batch's (:mod:`assets.event_batches`)."""
        ok = False
        try:
            if self._writes is not None and PreparedWrites.handles(event):
                with serialized_once(event) if self._memo else contextlib.nullcontext():
                    self._writes.store_event(event)
            else:
                super().store_event(event)
            ok = True
        finally:
            if self.batch is not None:
                self.batch.stored(event, ok)

    def _ask_table(self, table_name: str) -> bool:
        """``has_table`` on the index file, through the shared engine."""
        engine = self.engine(INDEX_SHARD_NAME)
        with engine.connect() as conn:
            return bool(engine.dialect.has_table(conn, table_name))

    def dispose(self) -> None:
        try:
            if self.batch is not None:
                self.batch.close()
        finally:
            self._dispose_engines()

    def _dispose_engines(self) -> None:
        with self._engines_lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()


@contextlib.contextmanager
def engines_shared(instance: dg.DagsterInstance, batch_run: str | None = None,
                   serialize_once: bool = True, prepared: bool = True) -> Iterator[bool]:
    """Within the block, the instance's default SQLite event storage keeps one engine per
    file (:class:`SharedEngines`), serializes each event once, writes materializations and
    check evaluations with statements built once (``prepared``,
    :mod:`assets.event_writes`), and, given ``batch_run``, commits that run's asset events
    in batches (:class:`assets.event_batches.Batch`); yields whether it does (False for any
    other storage, or when a private name it relies on is missing)."""
    storage = instance.event_log_storage
    if not engines_shareable(storage):
        yield False
        return
    assert isinstance(storage, SqliteEventLogStorage)
    with memo_installed() if serialize_once else contextlib.nullcontext(False) as memo:
        shared = SharedEngines(storage, batch_run, memo, prepared)
        try:
            with methods_replaced(storage, dict(zip(REPLACED, (
                    shared.connect, shared.has_table, shared.has_asset_key_index_cols,
                    shared.store_event), strict=True))):
                yield True
        finally:
            shared.dispose()


@contextlib.contextmanager
def methods_replaced(storage: object, replacements: dict[str, Any]) -> Iterator[None]:
    """Within the block, the storage's methods named are ``replacements`` (instance
    attributes, which Python looks up before the class's); each is removed after it unless
    someone replaced it again meanwhile."""
    for name, method in replacements.items():
        setattr(storage, name, method)
    try:
        yield
    finally:
        for name, method in replacements.items():
            if vars(storage).get(name) is method:
                delattr(storage, name)


@contextlib.contextmanager
def files_held(instance: dg.DagsterInstance, run_id: str) -> Iterator[int]:
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


POSTGRES_POOL_OVERFLOW = 4
"""Connections beyond the one kept, for threads writing at the same moment (closed after)."""


@contextlib.contextmanager
def postgres_connection_kept(instance: dg.DagsterInstance, answers: bool = True
                             ) -> Iterator[bool]:
    """Within the block, dagster-postgres's event storage keeps one connection open instead
    of connecting to PostgreSQL for every write (its engine's ``NullPool``); yields whether
    it does (False for any other storage, or when a name it relies on is missing)."""
    storage = instance.event_log_storage
    try:
        from dagster_postgres.event_log.event_log import PostgresEventLogStorage
        from dagster_postgres.utils import create_pg_engine
    except ImportError:  # dagster-postgres not installed: nothing to keep
        yield False
        return
    engine = getattr(storage, "_engine", None)
    url = getattr(storage, "postgres_url", None)
    if type(storage) is not PostgresEventLogStorage or not isinstance(engine, sa.Engine) \
            or not isinstance(engine.pool, NullPool) or not isinstance(url, str) \
            or not hasattr(storage, "_token_provider"):
        yield False  # not Dagster's own, or its engine pools already (webserver, a block)
        return
    # The engine dagster-postgres builds for the webserver (optimize_for_webserver), kept
    # only for the block: same URL, token provider and AUTOCOMMIT isolation. The block may
    # last hours (a long snapshot): a connection the server or a proxy closed meanwhile is
    # replaced on its next use (pre-ping), not an error in the run.
    kept = create_pg_engine(url, storage._token_provider, isolation_level="AUTOCOMMIT",
                            pool_size=1, max_overflow=POSTGRES_POOL_OVERFLOW,
                            pool_pre_ping=True)
    setattr(storage, "_engine", kept)  # noqa: B010  (a private attribute, checked above)
    try:
        if not answers:
            yield True
        else:
            with memo_installed() as memo, _answers_kept(storage, memo):
                yield True
    finally:
        if getattr(storage, "_engine", None) is kept:
            setattr(storage, "_engine", engine)  # noqa: B010
        kept.dispose()


@contextlib.contextmanager
def _answers_kept(storage: Any, memo: bool) -> Iterator[None]:
    """:class:`KeptAnswers` as the storage's methods for the block (unless replaced already,
    or one of them is not a method of the storage's class)."""
    if any(name in vars(storage) or not callable(getattr(type(storage), name, None))
           for name in _PG_REPLACED):
        yield
        return
    answers = KeptAnswers(storage, memo)
    with methods_replaced(storage, dict(zip(_PG_REPLACED, (
            answers.has_table, answers.has_asset_key_index_cols, answers.store_event),
            strict=True))):
        yield


_PG_REPLACED = ("has_table", "_has_asset_key_index_cols_on_connection", "store_event")
"""The PostgreSQL storage methods :class:`KeptAnswers` replaces for the block."""


@contextlib.contextmanager
def event_files_held(instance: dg.DagsterInstance, run_id: str) -> Iterator[int]:
    """Around an op that reports many events: on the default SQLite event storage, the run's
    event file and the index stay open (:func:`files_held`) and the storage keeps one engine
    per file (:func:`engines_shared`); on dagster-postgres's, one connection is kept
    (:func:`postgres_connection_kept`). Yields how many SQLite files are held (0 for any
    other storage)."""
    with files_held(instance, run_id) as held, engines_shared(instance, run_id), \
            postgres_connection_kept(instance):
        yield held
