"""Snapshot chunks read with ``COPY (...) TO STDOUT (FORMAT binary)``, in batches of rows.

A thread runs the COPY and hands batches of about ``batch_bytes`` through a queue of at
most two to the caller, so memory stays bounded by a few batches whatever the chunk's size
and PostgreSQL never runs far ahead. On an unencrypted connection the thread receives the
reply straight from the socket into large buffers (:mod:`pgcdc_dagster.postgres.copy_socket`:
no Python per row); under SSL or GSSAPI encryption it goes through libpq (psycopg2's
``copy_expert``, one ``write`` per row). The caller decodes a batch column-wise
(:mod:`pgcdc_dagster.cdc.copy_columns`). Transaction, snapshot import, session settings and
error translation are those of the text reader
(:func:`pgcdc_dagster.postgres.snapshot_read.read_text_batches`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import psycopg2
import psycopg2.errors
from psycopg2 import sql

from pgcdc_dagster.cdc.copy_columns import RowSpans, join_rows
from pgcdc_dagster.cdc.pgcopy import TRAILER, header_length
from pgcdc_dagster.postgres import copy_socket
from pgcdc_dagster.postgres.connection import connect
from pgcdc_dagster.postgres.snapshot_read import _translate, set_session, set_timeout, timed_out

BATCH_BYTES = 8 << 20
"""Row bytes per batch handed to the caller."""


USE_SOCKET = True
"""Read unencrypted connections from the socket (False: always through libpq)."""
_Stopped = copy_socket.Stopped


class _Queue:
    """Hands batches to the consumer, waiting while two are queued (until it stops)."""

    def __init__(self, stop: threading.Event) -> None:
        self.out: queue.Queue[RowSpans | None] = queue.Queue(maxsize=2)
        self.stop = stop

    def put(self, item: RowSpans | None) -> None:
        while True:
            if self.stop.is_set():
                raise _Stopped()
            try:
                self.out.put(item, timeout=0.1)
                return
            except queue.Full:
                continue


class _Batches:
    """The file object of libpq's COPY: collects rows, queues a batch every ``batch_bytes``
    (the stream header and trailer removed)."""

    def __init__(self, out: _Queue, batch_bytes: int, label: str) -> None:
        self.out = out
        self.batch_bytes = batch_bytes
        self.label = label
        self.rows: list[bytes] = []
        self.size = 0
        self.first = True

    def write(self, data: bytes) -> None:
        self.rows.append(data)
        self.size += len(data)
        if self.size >= self.batch_bytes:
            self.flush()

    def flush(self) -> None:
        rows = self.rows
        if rows and self.first:
            rows[0] = rows[0][header_length(rows[0], self.label):]
            if rows[0] in (b"", TRAILER):  # no row: the header came with the trailer
                rows.pop(0)
            self.first = False
        if rows and rows[-1] == TRAILER:
            rows.pop()
        if rows:
            self.out.put(join_rows(rows))
        self.rows, self.size = [], 0


def read_binary_rows(dsn: str, snapshot_name: str | None, query: sql.Composable, *,
                     batch_bytes: int = BATCH_BYTES,
                     label: str = "snapshot read",
                     statement_timeout_ms: int = 0,
                     within: psycopg2.extensions.connection | None = None,
                     ) -> Iterator[RowSpans]:
    """Yield the query's rows in batches of binary COPY tuples (header and trailer
    removed).

    With ``snapshot_name`` the query runs in a REPEATABLE READ READ ONLY transaction that
    imports that exported snapshot. ``within``: run it in that connection's open
    transaction instead (``snapshot_read.open_snapshot_transaction``: many small chunks of
    one snapshot on one connection); the caller ends the transaction and closes the
    connection, uses it no more once a read raised, and resets a statement_timeout a read
    set before the next (as with ``read_text_batches``). ``label`` names the work in error
    messages; ``statement_timeout_ms`` > 0 cancels the query after that long (an override).

    Raises:
        TableVanishedError: the table or a column no longer exists.
        SnapshotExpiredError: ``snapshot_name`` can no longer be imported.
        DecodeError: the stream is not binary COPY.
    """
    conn = within if within is not None else \
        connect(dsn, autocommit=False, application_name="pgcdc_dagster chunk reader")
    copy = sql.SQL("COPY ({}) TO STDOUT (FORMAT binary)").format(query).as_string(conn)
    stop = threading.Event()
    out = _Queue(stop)
    failure: list[BaseException] = []
    clean = [True]  # False while the socket reader has the reply half read

    def produce() -> None:
        try:
            with conn.cursor() as cur:
                if within is None:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    if snapshot_name:
                        cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
                    set_session(cur)
                if statement_timeout_ms:
                    set_timeout(cur, statement_timeout_ms)
                if USE_SOCKET and copy_socket.plain_socket(cur):
                    clean[0] = False
                    try:
                        copy_socket.copy_out(conn, copy, out.put, stop,
                                             batch_bytes=batch_bytes, label=label)
                    except copy_socket.ServerErrorResponse:
                        clean[0] = True  # read to its ReadyForQuery
                        raise
                    clean[0] = True
                else:
                    sink = _Batches(out, batch_bytes, label)
                    cur.copy_expert(copy, sink)
                    sink.flush()
        except BaseException as exc:
            failure.append(exc)
        try:
            out.put(None)
        except _Stopped:
            pass

    thread = threading.Thread(target=produce, name="pgcdc-copy-binary", daemon=True)
    thread.start()
    try:
        while True:
            rows = out.out.get()
            if rows is None:
                break
            yield rows
        thread.join()
        if failure and not isinstance(failure[0], _Stopped):
            exc = failure[0]
            if isinstance(exc, copy_socket.ServerErrorResponse):
                exc = _server_error(exc)
            if isinstance(exc, psycopg2.errors.QueryCanceled) and statement_timeout_ms:
                raise timed_out(exc, label, statement_timeout_ms) from None
            if isinstance(exc, psycopg2.Error):
                raise _translate(exc, label) from None
            raise exc
    finally:
        stop.set()
        if thread.is_alive():
            conn.cancel()  # the consumer stopped early: end the COPY
        thread.join(timeout=60)
        if within is None and not conn.closed:
            try:
                if clean[0]:  # libpq can end the transaction (else closing ends it)
                    conn.rollback()
            finally:
                conn.close()


def _server_error(exc: copy_socket.ServerErrorResponse) -> psycopg2.Error:
    """The psycopg2 exception libpq would have raised for the server's error."""
    try:
        cls = psycopg2.errors.lookup(exc.error.sqlstate)
    except KeyError:
        cls = psycopg2.DatabaseError
    error: psycopg2.Error = cls(exc.error.message)
    return error
