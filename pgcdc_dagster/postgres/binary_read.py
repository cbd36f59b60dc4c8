"""Snapshot chunks read with ``COPY (...) TO STDOUT (FORMAT binary)``, in batches of rows.

A thread runs the COPY (psycopg2 releases the GIL while it waits for the server) and
gathers the rows it receives (one ``write`` per row) into batches of about ``batch_bytes``;
a queue of at most two batches hands them to the caller, so memory stays bounded by a few
batches whatever the chunk's size and PostgreSQL never runs far ahead. The caller decodes a
batch column-wise (:mod:`pgcdc_dagster.cdc.copy_columns`). Transaction, snapshot import,
session settings and error translation are those of the text reader
(:func:`pgcdc_dagster.postgres.snapshot_read.read_text_batches`).
"""

from __future__ import annotations

import queue
import struct
import threading
from collections.abc import Iterator

import psycopg2
from psycopg2 import sql

from pgcdc_dagster.cdc.pgcopy import SIGNATURE
from pgcdc_dagster.exceptions import DecodeError
from pgcdc_dagster.postgres.connection import connect
from pgcdc_dagster.postgres.snapshot_read import _translate, set_session

BATCH_BYTES = 8 << 20
"""Row bytes per batch handed to the caller."""
_HEADER = struct.Struct(">11sii")
_TRAILER = b"\xff\xff"


class _Stopped(Exception):
    """The consumer went away: end the COPY."""


class _Batches:
    """The COPY's file object: collects rows, queues a batch every ``batch_bytes``."""

    def __init__(self, out: queue.Queue[list[bytes] | None], batch_bytes: int,
                 stop: threading.Event) -> None:
        self.out = out
        self.batch_bytes = batch_bytes
        self.stop = stop
        self.rows: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        self.rows.append(data)
        self.size += len(data)
        if self.size >= self.batch_bytes:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.put(self.rows)
        self.rows, self.size = [], 0

    def put(self, item: list[bytes] | None) -> None:
        while True:
            if self.stop.is_set():
                raise _Stopped()
            try:
                self.out.put(item, timeout=0.1)
                return
            except queue.Full:
                continue


def _strip_header(first: bytes, label: str) -> bytes:
    if len(first) < _HEADER.size or not first.startswith(SIGNATURE):
        raise DecodeError(f"{label}: the COPY stream does not start with the binary signature")
    _sig, flags, extension = _HEADER.unpack_from(first)
    if flags & (1 << 16):
        raise DecodeError(f"{label}: binary COPY with OIDs is not supported")
    return first[_HEADER.size + extension:]


def read_binary_rows(dsn: str, snapshot_name: str | None, query: sql.Composable, *,
                     batch_bytes: int = BATCH_BYTES,
                     label: str = "snapshot read") -> Iterator[list[bytes]]:
    """Yield the query's rows in batches, each row one binary COPY tuple (header and
    trailer removed).

    With ``snapshot_name`` the query runs in a REPEATABLE READ READ ONLY transaction that
    imports that exported snapshot. ``label`` names the work in error messages.

    Raises:
        TableVanishedError: the table or a column no longer exists.
        SnapshotExpiredError: ``snapshot_name`` can no longer be imported.
        DecodeError: the stream is not binary COPY.
    """
    conn = connect(dsn, autocommit=False, application_name="pgcdc_dagster chunk reader")
    copy = sql.SQL("COPY ({}) TO STDOUT (FORMAT binary)").format(query).as_string(conn)
    out: queue.Queue[list[bytes] | None] = queue.Queue(maxsize=2)
    stop = threading.Event()
    sink = _Batches(out, batch_bytes, stop)
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if snapshot_name:
                    cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
                set_session(cur)
                cur.copy_expert(copy, sink)
            sink.flush()
        except BaseException as exc:
            failure.append(exc)
        try:
            sink.put(None)
        except _Stopped:
            pass

    thread = threading.Thread(target=produce, name="pgcdc-copy-binary", daemon=True)
    thread.start()
    try:
        first = True
        while True:
            rows = out.get()
            if rows is None:
                break
            if first:
                rows[0] = _strip_header(rows[0], label)
                if rows[0] in (b"", _TRAILER):  # no row: the header came with the trailer
                    rows.pop(0)
                first = False
            if rows and rows[-1] == _TRAILER:
                rows.pop()
            if rows:
                yield rows
        thread.join()
        if failure and not isinstance(failure[0], _Stopped):
            exc = failure[0]
            if isinstance(exc, psycopg2.Error):
                raise _translate(exc, label) from None
            raise exc
    finally:
        stop.set()
        if thread.is_alive():
            conn.cancel()  # the consumer stopped early: end the COPY
        thread.join(timeout=60)
        if not conn.closed:
            try:
                conn.rollback()
            finally:
                conn.close()
