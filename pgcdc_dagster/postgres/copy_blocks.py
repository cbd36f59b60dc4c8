"""Many tables' rows read as Arrow text batches in one open transaction, one round trip each.

The consistency check reads every captured table in one REPEATABLE READ snapshot. A
snapshot chunk reader (:func:`~pgcdc_dagster.postgres.snapshot_read.read_text_batches`)
pays for a thread, a pipe and the session settings (six ``SET LOCAL``) per query: a few
milliseconds, times a thousand small tables. Here the caller sets the session settings
once per transaction (:func:`~pgcdc_dagster.postgres.snapshot_read.set_session`) and each
table costs one round trip: ``SAVEPOINT …; COPY (…) TO STDOUT`` sent as one simple query
(a failed COPY, e.g. of a table dropped meanwhile, is rolled back to the savepoint and the
transaction goes on for the next table).

psycopg2 hands the COPY's rows to the sink one by one; the sink gathers them into blocks of
``block_size`` bytes cut at a row end (COPY's text format escapes newlines inside values, so
every newline ends a row), and each block is parsed by pyarrow's CSV reader with the
snapshot reader's options and handed to ``consume`` at once: memory stays bounded by the
block whatever the table's size, and a small table is parsed once, after its last row.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

import psycopg2.extensions
import pyarrow as pa
from psycopg2 import sql

from pgcdc_dagster.postgres.snapshot_read import text_reader, unescape_batch

BLOCK_BYTES = 4 << 20
"""Text bytes parsed at a time."""
WRITE_BUFFER = 256 << 10
"""Bytes of rows gathered in C before the sink sees them."""
SAVEPOINT = "pgcdc_copy_block"


class _BlockSink(io.RawIOBase):
    """The COPY's file (behind an ``io.BufferedWriter``, which gathers psycopg2's row-by-row
    writes in C): text in, parsed batches out to ``consume``, a block at a time.

    An exception of ``consume`` is kept (and the remaining rows dropped), not raised into
    psycopg2's COPY loop, which would leave the connection mid-COPY."""

    def __init__(self, columns: Sequence[str], consume: Callable[[pa.RecordBatch], None],
                 block_size: int) -> None:
        super().__init__()
        self.columns = list(columns)
        self.consume = consume
        self.block_size = block_size
        self.parts: list[bytes] = []
        self.size = 0
        self.row_end: tuple[int, int] | None = None
        """The last newline written: (part, offset); a block is cut there."""
        self.failure: BaseException | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        chunk = bytes(data)
        if self.failure is None:
            end = chunk.rfind(b"\n")  # each byte is searched once: a long row costs no more
            if end >= 0:
                self.row_end = (len(self.parts), end + 1)
            self.parts.append(chunk)
            self.size += len(chunk)
            if self.size >= self.block_size and self.row_end is not None:
                part, offset = self.row_end
                block = b"".join([*self.parts[:part], self.parts[part][:offset]])
                self.parts = [self.parts[part][offset:], *self.parts[part + 1:]]
                self.size -= len(block)
                self.row_end = None
                self.parse(block)
        return len(chunk)

    def finish(self) -> None:
        """Parse what is left (COPY's last row ends with a newline)."""
        block = b"".join(self.parts)
        self.parts, self.size, self.row_end = [], 0, None
        if block:
            self.parse(block)

    def parse(self, block: bytes) -> None:
        if self.failure is not None:
            return
        try:
            # one parser block: the block is in memory already, and may hold a long row
            for batch in text_reader(pa.BufferReader(block), self.columns, len(block) + 1):
                self.consume(unescape_batch(batch, None))
        except BaseException as exc:  # kept for the caller, after the COPY ends
            self.failure = exc
            self.parts, self.size, self.row_end = [], 0, None


def copy_text_blocks(conn: psycopg2.extensions.connection, query: sql.Composable,
                     columns: Sequence[str], consume: Callable[[pa.RecordBatch], None],
                     *, block_size: int = BLOCK_BYTES) -> None:
    """Run ``COPY (query) TO STDOUT`` in ``conn``'s open transaction and hand its rows to
    ``consume`` as batches of text columns named ``columns`` (NULL as null).

    On a failure (the server's, or ``consume``'s) the transaction is rolled back to the
    savepoint taken before the COPY, so the caller can go on with the next query, and the
    failure is raised.
    """
    copy = sql.SQL("SAVEPOINT {}; COPY ({}) TO STDOUT").format(
        sql.Identifier(SAVEPOINT), query)
    sink = _BlockSink(columns, consume, block_size)
    try:
        with conn.cursor() as cur, io.BufferedWriter(sink, WRITE_BUFFER) as buffered:
            cur.copy_expert(copy, buffered)
        sink.finish()
    except psycopg2.Error:
        _back_to_savepoint(conn)
        raise
    if sink.failure is not None:
        raise sink.failure


def _back_to_savepoint(conn: psycopg2.extensions.connection) -> None:
    with conn.cursor() as cur:
        cur.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(sql.Identifier(SAVEPOINT)))
