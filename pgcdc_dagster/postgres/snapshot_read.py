"""Reading table chunks with COPY inside an exported snapshot, as streams of Arrow batches.

COPY ... (FORMAT csv) gives every value in its type's text output, the same text pgoutput
sends, so one set of converters serves the snapshot and the stream. The COPY runs in a
thread writing into an OS pipe that pyarrow's streaming CSV reader consumes: memory stays
bounded by the CSV block size whatever the chunk's size.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psycopg2.extensions
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg2 import sql

from pgcdc_dagster.postgres.connection import connect

CSV_BLOCK_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class Chunk:
    """A CTID block range ``[start_block, end_block)`` of one table; ``end_block`` None = open."""

    schema: str
    table: str
    index: int
    start_block: int
    end_block: int | None


def table_blocks(conn: psycopg2.extensions.connection, schema: str, table: str) -> int:
    """Number of heap blocks of the table now (an upper bound for any older snapshot)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT pg_relation_size(format('%%I.%%I', %s::text, %s::text)::regclass, 'main') "
            "/ current_setting('block_size')::bigint",
            (schema, table),
        )
        return int(cur.fetchone()[0])


def plan_chunks(schema: str, table: str, blocks: int, blocks_per_chunk: int) -> list[Chunk]:
    """Split ``blocks`` heap blocks into CTID ranges; the last range is open-ended."""
    step = max(1, blocks_per_chunk)
    chunks = []
    start = 0
    index = 0
    while True:
        end = start + step
        if end >= blocks:
            chunks.append(Chunk(schema, table, index, start, None))
            return chunks
        chunks.append(Chunk(schema, table, index, start, end))
        start = end
        index += 1


def chunk_query(chunk: Chunk, columns: Sequence[str]) -> sql.Composed:
    """``SELECT cols FROM t WHERE ctid >= '(a,0)' AND ctid < '(b,0)'`` (a TID range scan)."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    cond = [sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({chunk.start_block},0)"))]
    if chunk.end_block is not None:
        cond.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({chunk.end_block},0)")))
    return sql.SQL("SELECT {} FROM {} WHERE {}").format(
        cols, sql.Identifier(chunk.schema, chunk.table), sql.SQL(" AND ").join(cond))


def _csv_reader(fd: int, columns: Sequence[str]) -> pacsv.CSVStreamingReader:
    names = list(columns)
    return pacsv.open_csv(
        os.fdopen(fd, "rb", closefd=True),
        read_options=pacsv.ReadOptions(column_names=names, block_size=CSV_BLOCK_BYTES),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types={n: pa.string() for n in names},
            strings_can_be_null=True,
            null_values=[""],
            quoted_strings_can_be_null=False,
        ),
    )


def read_text_batches(dsn: str, snapshot_name: str | None, query: sql.Composable,
                      columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """Yield batches of the query's rows, every column as text (NULL as null).

    With ``snapshot_name`` the query runs in a REPEATABLE READ READ ONLY transaction that
    imports that exported snapshot, so every chunk sees the same consistent state.
    """
    conn = connect(dsn, autocommit=False, application_name="pgcdc_dagster chunk reader")
    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(write_fd, "wb", closefd=True) as sink, conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if snapshot_name:
                    cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
                cur.execute("SET LOCAL client_encoding = 'UTF8'")
                copy = sql.SQL("COPY ({}) TO STDOUT (FORMAT csv)").format(query)
                cur.copy_expert(copy.as_string(conn), sink, size=1 << 20)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=produce, name="pgcdc-copy", daemon=True)
    thread.start()
    try:
        try:
            reader = _csv_reader(read_fd, columns)
        except pa.ArrowInvalid:
            reader = None  # empty input: pyarrow cannot open a CSV without a first block
        if reader is not None:
            yield from reader
        thread.join()
    finally:
        thread.join(timeout=60)
        conn.rollback()
        conn.close()
    if failure:
        raise failure[0]
