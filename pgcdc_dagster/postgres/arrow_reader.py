"""Bulk reads from PostgreSQL as Arrow record batches, through ADBC's PostgreSQL driver.

Every bulk read of the source (snapshot chunks, incremental snapshot chunks, the consistency
check's reads) runs here. ``adbc-driver-postgresql`` (Apache Arrow's driver on libpq) runs
a query as ``COPY (query) TO STDOUT (FORMAT binary)`` and builds Arrow arrays in C++, one
batch of about ``batch_bytes`` at a time as the caller pulls them: memory stays bounded by
a batch whatever the query returns, and TLS (``sslmode=require``) is libpq's, so an
encrypted connection takes the same path as a plain one. No protocol bytes are read or
written here.

A reader joins an exported snapshot: ``BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY``,
``SET TRANSACTION SNAPSHOT``, then the session settings the text converters expect
(:data:`~pgcdc_dagster.postgres.snapshot_read.SESSION_SETTINGS`, transaction-local), so every
chunk sees the same consistent state and columns selected as text print as pgoutput would.

Queries are composed with ``psycopg2.sql`` (identifiers quoted, values as literals) and
rendered here without a psycopg2 connection (:func:`render`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import suppress
from typing import Any

import adbc_driver_manager
import adbc_driver_postgresql
import psycopg2.extensions
import pyarrow as pa
from psycopg2 import sql

from pgcdc_dagster.exceptions import ConfigurationError, PgCdcError, SourceUnavailableError
from pgcdc_dagster.postgres.connection import (
    connect_options,
    describe_dsn,
    redact,
    session_options,
)
from pgcdc_dagster.postgres.dsn import scrub
from pgcdc_dagster.postgres.snapshot_read import (
    SESSION_SETTINGS,
    SnapshotExpiredError,
    TableVanishedError,
    timed_out_message,
)

BATCH_BYTES = 8 << 20
"""Arrow bytes per batch the driver builds (``adbc.postgresql.batch_size_hint_bytes``)."""
_BATCH_OPTION = "adbc.postgresql.batch_size_hint_bytes"
_SAVEPOINT = "pgcdc_read"
_SNAPSHOT_NAME = re.compile(r"^[0-9A-Fa-f]+(-[0-9A-Fa-f]+)+$")


# --- SQL text ------------------------------------------------------------------------------

def quote_literal(value: object) -> str:
    """A SQL literal of a string (``E''`` when it holds a backslash), number or None."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if "\x00" in text:
        raise ValueError("a SQL literal cannot hold a NUL character")
    quoted = text.replace("'", "''")
    if "\\" in quoted:
        return "E'" + quoted.replace("\\", "\\\\") + "'"
    return "'" + quoted + "'"


def render(query: sql.Composable) -> str:
    """The SQL text of a ``psycopg2.sql`` composition, rendered without a connection:
    identifiers double-quoted, literals by :func:`quote_literal` (``E''`` strings escape
    backslashes whatever ``standard_conforming_strings`` is)."""
    if isinstance(query, sql.Composed):
        return "".join(render(part) for part in query.seq)
    if isinstance(query, sql.SQL):
        return str(query.string)
    if isinstance(query, sql.Identifier):
        return ".".join('"' + s.replace('"', '""') + '"' for s in query.strings)
    if isinstance(query, sql.Literal):
        return quote_literal(query.wrapped)
    raise TypeError(f"cannot render {type(query).__name__} without a connection")


def text_output(column: str) -> sql.Composable:
    """A column as its type's text output (NULL stays NULL); see :func:`text_select`."""
    return sql.SQL("CASE WHEN num_nulls({c}) = 0 THEN concat({c}) END").format(
        c=sql.Identifier(column))


def text_select(query: sql.Composable, columns: Sequence[str]) -> sql.Composable:
    """``query``'s ``columns``, each as its type's text output (``concat(col)`` calls the
    output function, as COPY's text format does: ``inet`` without ``/32``, ``char(n)``
    padded; NULL stays NULL), in order."""
    items = [text_output(name) for name in columns]
    return sql.SQL("SELECT {} FROM ({}) AS _pgcdc_rows").format(sql.SQL(", ").join(items),
                                                                query)


# --- connections ---------------------------------------------------------------------------

def _error_text(exc: BaseException) -> str:
    message = str(exc).strip() or type(exc).__name__
    for prefix in ("INVALID_DATA: ", "INVALID_STATE: ", "INVALID_ARGUMENT: ", "IO: ",
                   "CANCELLED: ", "UNKNOWN: ", "NOT_FOUND: "):
        message = message.removeprefix(prefix)
    message = message.replace("[libpq] ", "")
    line = next((part for part in message.splitlines() if "ERROR:" in part), None)
    if line is not None:
        return line.split("ERROR:", 1)[1].strip()
    return message.splitlines()[0]


def translate(exc: adbc_driver_manager.Error, label: str,
              statement_timeout_ms: int = 0) -> Exception:
    """The error to raise for a driver error: one the user can act on when it is one."""
    state = getattr(exc, "sqlstate", None) or ""
    message = _error_text(exc)
    if state in ("42P01", "42703", "3F000"):  # undefined table, column, schema
        return TableVanishedError(
            f"{label}: {message}. The table or column was dropped or renamed after the "
            "snapshot was planned. Remove it from table.include.list (or restore it) and run "
            "the snapshot again; chunks already read are kept.")
    if state == "25006":
        return ConfigurationError(
            f"{label}: {message}. Snapshot reads run in READ ONLY transactions; a "
            "snapshot.select.statement.overrides SELECT must not write (no nextval(), no "
            "functions that modify data).")
    if state == "22023" and "snapshot" in message:
        return SnapshotExpiredError(
            f"{label}: {message}. The exported snapshot is gone (its replication connection "
            "closed before every chunk was read: a server restart, pg_terminate_backend, or "
            "an idle_in_transaction_session_timeout given in the DSN's options, which "
            "override the project's own session settings). Run the snapshot again; it resumes "
            "with the chunks not yet read.")
    if state == "57014" and statement_timeout_ms:
        return PgCdcError(timed_out_message(label, message, statement_timeout_ms))
    return PgCdcError(f"{label}: {message}" + (f" (SQLSTATE {state})" if state else ""))


_DATABASES: dict[str, adbc_driver_manager.AdbcDatabase] = {}
"""The driver's database handle of each connection string, made on first use: it loads
PostgreSQL's type catalog once (a connection of its own), so each reader after the first
costs one connection, not two."""
_DATABASES_LOCK = threading.Lock()


def connect_arrow(dsn: str, *, application_name: str = "pgcdc_dagster chunk reader"
                  ) -> adbc_driver_manager.AdbcConnection:
    """An ADBC connection (autocommit; ``connect_timeout`` as :func:`connection.connect`).

    Raises:
        ConfigurationError: the DSN does not parse (never quoted).
        SourceUnavailableError: the server cannot be reached; host and port named, never
            the password.
    """
    try:
        target = psycopg2.extensions.make_dsn(
            dsn, application_name=application_name,
            **{k: str(v) for k, v in {**connect_options(dsn), **session_options(dsn)}.items()})
    except psycopg2.ProgrammingError:
        raise ConfigurationError(
            "PGCDC_PG_DSN is not a valid libpq connection string; the value is not shown "
            "here because it holds the password.") from None
    try:
        with _DATABASES_LOCK:
            database = _DATABASES.get(target)
            if database is None:
                database = adbc_driver_postgresql.connect(target)
                _DATABASES[target] = database
        return adbc_driver_manager.AdbcConnection(database)
    except adbc_driver_manager.Error as exc:
        message = scrub(redact(_error_text(exc)), dsn).strip()
        raise SourceUnavailableError(
            f"cannot connect to the source PostgreSQL ({describe_dsn(dsn)}): {message}. "
            "Check PGCDC_PG_DSN and that the server is running and accepts connections "
            "from this host.") from None


class ArrowSnapshot:
    """One ADBC connection in a REPEATABLE READ READ ONLY transaction that imported an
    exported snapshot (or took its own), with the session settings pinned: many reads of
    one consistent state, one after the other. Close it (or use it as a context manager).

    Raises (on opening):
        SnapshotExpiredError: ``snapshot_name`` can no longer be imported.
    """

    def __init__(self, dsn: str, snapshot_name: str | None, *,
                 label: str = "snapshot read",
                 application_name: str = "pgcdc_dagster chunk reader") -> None:
        if snapshot_name is not None and not _SNAPSHOT_NAME.match(snapshot_name):
            raise ValueError(f"not an exported snapshot's name: {snapshot_name!r}")
        self.conn = connect_arrow(dsn, application_name=application_name)
        self.timeout_ms = 0
        try:
            self._run("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            if snapshot_name:
                self._run(f"SET TRANSACTION SNAPSHOT {quote_literal(snapshot_name)}")
            settings = ", ".join(f"set_config({quote_literal(name)}, {quote_literal(value)}, "
                                 "true)" for name, value in SESSION_SETTINGS)
            self._run(f"SELECT {settings}")
        except adbc_driver_manager.Error as exc:
            self.close()
            raise translate(exc, label) from None
        except BaseException:
            self.close()
            raise

    def _run(self, statement: str) -> None:
        stmt = adbc_driver_manager.AdbcStatement(self.conn)
        try:
            stmt.set_sql_query(statement)
            stmt.execute_update()
        finally:
            stmt.close()

    def set_timeout(self, timeout_ms: int) -> None:
        """``statement_timeout`` of the next reads (0: none), for this transaction."""
        if timeout_ms != self.timeout_ms:
            self._run(f"SELECT set_config('statement_timeout', '{int(timeout_ms)}ms', true)")
            self.timeout_ms = timeout_ms

    def batches(self, query: sql.Composable | str, *, label: str = "snapshot read",
                batch_bytes: int = BATCH_BYTES, statement_timeout_ms: int = 0,
                savepoint: bool = False) -> Iterator[pa.RecordBatch]:
        """The query's rows as record batches of about ``batch_bytes``, read as they are
        pulled; ``statement_timeout_ms`` > 0 cancels the query after that long (user SQL).
        ``savepoint``: a failed read rolls back to a savepoint taken before it, so the
        transaction stays usable for the next reads (many tables in one snapshot).

        Raises:
            TableVanishedError: the table or a column no longer exists.
            PgCdcError: the server's error, naming ``label`` (a timeout names its setting).
        """
        text = query if isinstance(query, str) else render(query)
        try:
            self.set_timeout(statement_timeout_ms)
            if savepoint:
                self._run(f"SAVEPOINT {_SAVEPOINT}")
            stmt = adbc_driver_manager.AdbcStatement(self.conn)
            try:
                stmt.set_options(**{_BATCH_OPTION: str(max(1, batch_bytes))})
                stmt.set_sql_query(text)
                stream, _ = stmt.execute_query()
                with pa.RecordBatchReader.from_stream(stream) as reader:
                    yield from reader
            finally:
                stmt.close()
        except adbc_driver_manager.Error as exc:
            if savepoint:
                self._run(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            raise translate(exc, label, statement_timeout_ms) from None

    def close(self) -> None:
        conn: Any = getattr(self, "conn", None)
        if conn is None:
            return
        self.conn = None  # type: ignore[assignment]
        with suppress(adbc_driver_manager.Error, RuntimeError):
            conn.close()  # ends the transaction

    def __enter__(self) -> ArrowSnapshot:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def read_batches(dsn: str, snapshot_name: str | None, query: sql.Composable | str, *,
                 label: str = "snapshot read", batch_bytes: int = BATCH_BYTES,
                 statement_timeout_ms: int = 0, within: ArrowSnapshot | None = None
                 ) -> Iterator[pa.RecordBatch]:
    """:meth:`ArrowSnapshot.batches` of a reader of its own (``within``: of that open
    reader, left open)."""
    if within is not None:
        yield from within.batches(query, label=label, batch_bytes=batch_bytes,
                                  statement_timeout_ms=statement_timeout_ms)
        return
    with ArrowSnapshot(dsn, snapshot_name, label=label) as reader:
        yield from reader.batches(query, label=label, batch_bytes=batch_bytes,
                                  statement_timeout_ms=statement_timeout_ms)
