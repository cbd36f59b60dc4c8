"""Dagster's SQLite writes of an asset materialization and a check evaluation, with each
statement built once (issue 16).

``SqliteEventLogStorage.store_event`` builds every statement it runs afresh for each event
(``insert().values(**row)``, and for a materialization an INSERT *and* an UPDATE of the asset
key, of which it runs one): SQLAlchemy coerces each value into a bound literal and computes
the statement's cache key every time, about half of the storage's CPU per event. Within
:class:`assets.event_storage.SharedEngines` these two kinds of event go through
:meth:`PreparedWrites.store_event` instead: the same statements, run in the same order on
the same connections (the storage's ``_connect``), with the values passed as parameters of
statements built once; the row values come from Dagster's own helpers (``_event_to_row``,
``_get_asset_entry_values``, ``_store_asset_event_tags``). SQLAlchemy compiles each statement
once per set of parameter names, for the connection's dialect, and the values go through the
compiled statement's bind processors (a datetime becomes SQLAlchemy's text for it), so the
rows are the ones Dagster writes; the statement then runs on the connection's SQLite driver
connection (``sqlite3``), without SQLAlchemy's execution context per statement.

Each of Dagster's ``_connect`` blocks that runs a single statement is marked ``atomic``: a
statement that fails changes nothing (SQLite undoes it alone), so the batch
(:mod:`assets.event_batches`) needs no savepoint around it. The check execution's UPDATE and
the INSERT that follows it only when the UPDATE matched no row are such a block too: the
INSERT never follows a change. Only the materialization's index block (the event's row, its
indexed tags, the asset key) keeps its savepoint.

Any other event, a runless check evaluation, or a materialization without an asset key goes
to Dagster's own ``store_event``. What it mirrors is ``dagster`` 1.13.27's (pinned):
``SqliteEventLogStorage.store_event``, ``SqlEventLogStorage._store_asset_event`` and
``_update_asset_check_evaluation``; the names it calls are checked by
:func:`prepared_writes_usable`. Of SQLAlchemy (2.0, pinned) it uses a compiled statement's
``positiontup`` and ``_bind_processors``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import dagster._check as check
import sqlalchemy as sa
from dagster._core.errors import DagsterInvariantViolationError
from dagster._core.events import DagsterEventType
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.schema import (
    AssetCheckExecutionsTable,
    AssetKeyTable,
    SqlEventLogStorageTable,
)
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SqliteEventLogStorage,
)
from sqlalchemy.dialects import sqlite as sa_sqlite

Connect = Callable[[str, bool], contextlib.AbstractContextManager[sa.Connection]]
"""The storage's ``_connect`` for a shard; the flag: the block runs one statement only."""

_HELPERS = ("_event_to_row", "_event_insert_timestamp", "_get_asset_entry_values",
            "_store_asset_event_tags", "_has_asset_key_index_cols_on_connection")
"""Dagster's methods that compute the rows (called, not mirrored)."""
_MIRRORED = ("store_event", "_store_asset_event", "store_asset_check_event",
             "_update_asset_check_evaluation")
"""Dagster's methods whose statements :class:`PreparedWrites` runs itself."""


def prepared_writes_usable(storage: object) -> bool:
    """Whether ``storage`` is Dagster's own SQLite storage, none of the methods mirrored or
    called overridden by a subclass."""
    if not isinstance(storage, SqliteEventLogStorage):
        return False
    cls = type(storage)
    probe: Any = _INSERT_EVENT.compile(dialect=sa_sqlite.dialect(), column_keys=["timestamp"])
    return all(callable(getattr(SqliteEventLogStorage, name, None)) and
               getattr(cls, name, None) is getattr(SqliteEventLogStorage, name)
               for name in (*_HELPERS, *_MIRRORED)) and \
        isinstance(getattr(probe, "_bind_processors", None), dict) and \
        isinstance(getattr(probe, "positiontup", None), list)


_INSERT_EVENT = SqlEventLogStorageTable.insert()
_INSERT_KEY = AssetKeyTable.insert()
_UPDATE_KEY = AssetKeyTable.update().where(
    AssetKeyTable.c.asset_key == sa.bindparam("w_asset_key"))
_INSERT_CHECK = AssetCheckExecutionsTable.insert()
_CHECK_ROW = (AssetCheckExecutionsTable.c.asset_key == sa.bindparam("w_asset_key"),
              AssetCheckExecutionsTable.c.check_name == sa.bindparam("w_check_name"),
              AssetCheckExecutionsTable.c.run_id == sa.bindparam("w_run_id"))
_UPDATE_CHECK = AssetCheckExecutionsTable.update().where(
    *_CHECK_ROW, AssetCheckExecutionsTable.c.partition.is_(None))
_UPDATE_PARTITION_CHECK = AssetCheckExecutionsTable.update().where(
    *_CHECK_ROW, AssetCheckExecutionsTable.c.partition == sa.bindparam("w_partition"))
"""The statements, built once: values are parameters (``w_*``: the WHERE clause's)."""

_Compiled = tuple[str, list[str], dict[str, Callable[[Any], Any]]]
_compiled: dict[tuple[str, int, tuple[str, ...]], _Compiled] = {}
_compiled_lock = threading.Lock()


def _run(conn: sa.Connection, statement: sa.ClauseElement, params: dict[str, Any]
         ) -> sqlite3.Cursor:
    """``statement`` with ``params`` on the connection's SQLite driver connection, compiled
    once per set of parameter names by SQLAlchemy for the connection's dialect, the values
    through its bind processors (a datetime to SQLAlchemy's text), as ``conn.execute``
    would, without building an execution context per statement."""
    key = (conn.dialect.name, id(statement), tuple(params))
    found = _compiled.get(key)
    if found is None:
        compiled: Any = statement.compile(
            dialect=conn.dialect, column_keys=[k for k in params if not k.startswith("w_")])
        found = (str(compiled), list(compiled.positiontup or ()),
                 dict(compiled._bind_processors))
        with _compiled_lock:
            _compiled[key] = found
    sql, names, processors = found
    raw: Any = conn.connection.dbapi_connection
    cursor: sqlite3.Cursor = raw.execute(sql, tuple(
        processors[name](params[name]) if name in processors else params[name]
        for name in names))
    return cursor


class PreparedWrites:
    """A materialization's and a check evaluation's writes, statements built once."""

    def __init__(self, storage: SqliteEventLogStorage, connect: Connect) -> None:
        self._storage: Any = storage
        self._connect = connect

    @staticmethod
    def handles(event: EventLogEntry) -> bool:
        """Whether :meth:`store_event` writes ``event`` (else: Dagster's ``store_event``)."""
        dagster_event = event.dagster_event
        if dagster_event is None:
            return False
        if dagster_event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            return dagster_event.asset_key is not None
        return dagster_event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION and \
            bool(event.run_id)

    def store_event(self, event: EventLogEntry) -> None:
        """``SqliteEventLogStorage.store_event`` of an event :meth:`handles`."""
        check.inst_param(event, "event", EventLogEntry)
        storage = self._storage
        row = storage._event_to_row(event)
        with self._connect(event.run_id, True) as conn:
            _run(conn, _INSERT_EVENT, row)
        if event.dagster_event_type == DagsterEventType.ASSET_MATERIALIZATION:
            with self._connect(INDEX_SHARD_NAME, False) as conn:
                event_id = self._inserted(conn, row)
                storage._store_asset_event_tags(conn, [event], [event_id])
                self._store_asset_key(conn, event, event_id)
        else:
            with self._connect(INDEX_SHARD_NAME, True) as conn:
                event_id = self._inserted(conn, row)
            check.invariant(
                storage.supports_asset_checks,
                "Asset checks require a database schema migration. Run `dagster instance "
                "migrate`.")
            self._store_check_evaluation(event, event_id, row["event"])

    def _inserted(self, conn: sa.Connection, row: dict[str, Any]) -> int:
        event_id = _run(conn, _INSERT_EVENT, row).lastrowid
        if event_id is None:
            raise DagsterInvariantViolationError(
                "Cannot store asset event tags for null event id.")
        return int(event_id)

    def _store_asset_key(self, conn: sa.Connection, event: EventLogEntry,
                         event_id: int) -> None:
        """``SqlEventLogStorage._store_asset_event``: the asset key's row inserted, or
        updated when it exists."""
        storage = self._storage
        asset_key = event.get_dagster_event().asset_key
        assert asset_key is not None  # handles() checked
        values = storage._get_asset_entry_values(
            event, event_id, storage._has_asset_key_index_cols_on_connection(conn))
        if not values:
            return
        key = asset_key.to_string()
        try:
            _run(conn, _INSERT_KEY, {"asset_key": key, **values})
        except sqlite3.IntegrityError:
            _run(conn, _UPDATE_KEY, {**values, "w_asset_key": key})

    def _store_check_evaluation(self, event: EventLogEntry, event_id: int,
                                text: str) -> None:
        """``SqlEventLogStorage._update_asset_check_evaluation`` (``text``: the event as
        serialized for its row, what Dagster serializes again here)."""
        evaluation = event.get_dagster_event().asset_check_evaluation_data
        target = evaluation.target_materialization_data
        values = {
            "execution_status": (AssetCheckExecutionRecordStatus.SUCCEEDED.value
                                 if evaluation.passed else
                                 AssetCheckExecutionRecordStatus.FAILED.value),
            "evaluation_event": text,
            "evaluation_event_timestamp": self._storage._event_insert_timestamp(event),
            "evaluation_event_storage_id": event_id,
            "materialization_event_storage_id": target.storage_id if target else None,
            "partition": evaluation.partition,
        }
        key = evaluation.asset_key.to_string()
        where = {"w_asset_key": key, "w_check_name": evaluation.check_name,
                 "w_run_id": event.run_id}
        if evaluation.partition is not None:
            where["w_partition"] = evaluation.partition
        with self._connect(INDEX_SHARD_NAME, True) as conn:
            update = _UPDATE_CHECK if evaluation.partition is None else \
                _UPDATE_PARTITION_CHECK
            rows_updated = _run(conn, update, {**values, **where}).rowcount
            if rows_updated == 0:  # nothing changed yet: the block stays one change
                rows_updated = _run(conn, _INSERT_CHECK, {
                    **values, "asset_key": key, "check_name": evaluation.check_name,
                    "run_id": event.run_id,
                    "evaluation_event_timestamp": _utc_naive(event.timestamp)}).rowcount
        if rows_updated > 1:
            raise DagsterInvariantViolationError(
                f"Updated {rows_updated} rows for asset check evaluation "
                f"{evaluation.asset_check_key} as a result of duplicate AssetCheckPlanned "
                "events.")


def _utc_naive(timestamp: float) -> datetime:
    """``datetime.utcfromtimestamp`` (what Dagster's INSERT of a check execution stores)."""
    return datetime.fromtimestamp(timestamp, UTC).replace(tzinfo=None)
