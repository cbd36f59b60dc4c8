"""``COPY ... TO STDOUT (FORMAT binary)`` read from the connection's socket in large buffers.

psycopg2's ``copy_expert`` calls Python once per row (libpq returns one CopyData message at
a time), which costs about as much as decoding the row. Here the COPY is sent as a simple
``Query`` message on the socket of an open psycopg2 connection (after libpq has finished
every exchange, so nothing is pending on either side), and the reply is received with
``recv_into`` into buffers of ``batch_bytes``; :class:`~pgcdc_dagster.cdc.copy_frames.CopyOutFramer`
finds the rows in each buffer. The reply is read to its ``ReadyForQuery``, so libpq finds
the connection as it left it (in the same transaction) and ends it as usual.

Only an unencrypted connection can be read this way: under SSL or GSSAPI encryption the
socket carries ciphertext. :func:`plain_socket` tells; the caller then uses libpq.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import weakref
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import psycopg2.extensions

from pgcdc_dagster.cdc.copy_columns import RowSpans
from pgcdc_dagster.cdc.copy_frames import READY_FOR_QUERY, CopyOutFramer, ServerError
from pgcdc_dagster.exceptions import DecodeError

PAD = 16
"""Spare bytes after a buffer's data (see :class:`RowSpans`)."""
WAIT_MS = 2
"""Longest wait for more of the reply before taking what has arrived (and checking whether
to stop)."""
LOW_WATER = 256 << 10
"""Once this much of a reply has arrived, the socket reports itself readable only when this
much more has (``SO_RCVLOWAT``): one ``recv`` per quarter megabyte instead of one per 8 kB
packet of the server's. Until then it wakes on any byte: a small table's whole reply is
less, and would otherwise wait out :data:`WAIT_MS` for it (issue 16: 2-3 ms per table)."""


class Stopped(Exception):
    """The consumer went away: stop reading."""


class ServerErrorResponse(Exception):
    """The server ended the COPY with an error (translated by the caller)."""

    def __init__(self, error: ServerError) -> None:
        super().__init__(error.message)
        self.error = error


_PLAIN: weakref.WeakKeyDictionary[psycopg2.extensions.connection, bool] = \
    weakref.WeakKeyDictionary()
""":func:`plain_socket`'s answer per open connection (a connection's encryption is settled
when it is made): the chunks of small tables that share a connection ask once."""


def plain_socket(cur: psycopg2.extensions.cursor) -> bool:
    """True when the connection's socket carries the protocol in the clear (no SSL, no
    GSSAPI encryption: ``pg_stat_gssapi`` exists from PostgreSQL 12 on, when GSSAPI
    encryption appeared)."""
    conn = cur.connection
    known = _PLAIN.get(conn)
    if known is not None:
        return known
    if conn.info.ssl_in_use:
        plain = False
    elif conn.server_version < 120000:
        plain = True
    else:
        cur.execute("SELECT coalesce((SELECT encrypted FROM pg_stat_gssapi "
                    "WHERE pid = pg_backend_pid()), false)")
        row = cur.fetchone()
        plain = not (row and row[0])
    _PLAIN[conn] = plain
    return plain


def _query_message(conn: psycopg2.extensions.connection, text: str) -> bytes:
    codec = psycopg2.extensions.encodings.get(conn.encoding, "utf-8")
    payload = text.encode(codec) + b"\x00"
    return b"Q" + struct.pack("!i", len(payload) + 4) + payload


MAX_MESSAGE = (1 << 30) + 64
"""PostgreSQL builds a COPY row in one buffer of at most 1 GiB: a longer message is damage."""


def _needed(buf: bytearray | npt.NDArray[np.uint8], pos: int, filled: int) -> int:
    """Bytes the message at ``pos`` needs in all (0 while its length is not in yet).

    Raises:
        DecodeError: a length no server sends.
    """
    if filled - pos < 5:
        return 0
    (length,) = struct.unpack("!i", bytes(buf[pos + 1:pos + 5]))
    if not 4 <= length <= MAX_MESSAGE:
        raise DecodeError(f"protocol message {chr(buf[pos])!r} with length {length}")
    return int(length) + 1


def copy_out(conn: psycopg2.extensions.connection, query: str, emit: Callable[[RowSpans], None],
             stop: threading.Event, *, batch_bytes: int, label: str) -> None:
    """Run ``query`` (a ``COPY ... TO STDOUT (FORMAT binary)``) over the raw socket and
    ``emit`` its rows batch by batch (each batch owns its buffer).

    Raises:
        ServerErrorResponse: the server reported an error (after its ``ReadyForQuery``).
        Stopped: ``stop`` was set.
        DecodeError: the reply is not a binary COPY.
        ConnectionError: the server closed the connection.
    """
    framer = CopyOutFramer(label)
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    try:
        sock.settimeout(10.0)  # polls; the descriptor stays non-blocking for libpq
        sock.sendall(_query_message(conn, query))
        sock.setblocking(False)
        capacity = max(batch_bytes, 1 << 16)
        buf = _buffer(capacity)
        filled = 0
        received = 0  # the low-water mark is raised once the reply proves large
        while not framer.done:
            if stop.is_set():
                raise Stopped()
            if filled == capacity:  # one message fills the buffer: make room for it
                need = _needed(buf, 0, filled)
                capacity = max(need, capacity * 2)
                grown = _buffer(capacity)
                grown[:filled] = buf[:filled]
                buf = grown
            poller.poll(WAIT_MS)  # until LOW_WATER bytes are in (or the wait is over)
            try:
                got = sock.recv_into(buf.data[filled:capacity])
            except BlockingIOError:
                continue
            if not got:
                raise ConnectionError(f"{label}: the server closed the connection during COPY")
            filled += got
            if received < LOW_WATER <= received + got:
                _low_water(sock, LOW_WATER)
            received += got
            if filled < capacity and bytes(buf[filled - 6:filled - 1]) != READY_FOR_QUERY:
                continue
            starts, ends, pos = framer.frame(buf, 0, filled)
            tail = filled - pos
            if len(starts):
                emit(RowSpans(buf, starts, ends))
                size = max(batch_bytes, 1 << 16, _needed(buf, pos, filled))
                fresh = _buffer(size)
                fresh[:tail] = buf[pos:filled]
                buf, capacity = fresh, size
            elif pos:
                buf[:tail] = buf[pos:filled]
            filled = tail
        if framer.error is not None:
            raise ServerErrorResponse(framer.error)
        if not framer.complete:
            raise DecodeError(f"{label}: the COPY ended without the binary trailer")
    finally:
        _low_water(sock, 1)  # the socket is libpq's again
        sock.close()  # the duplicate descriptor; libpq keeps its own


def _buffer(size: int) -> npt.NDArray[np.uint8]:
    """``size`` bytes to receive into, and :data:`PAD` more (uninitialised: every byte a
    row uses is received first; the pad only has to exist)."""
    return np.empty(size + PAD, dtype=np.uint8)


def _low_water(sock: socket.socket, size: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, size)
    except OSError:  # not supported here: one recv per packet, as before
        pass
