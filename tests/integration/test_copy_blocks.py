"""Many tables read in one open transaction, one round trip each (``postgres/copy_blocks.py``).

Blocks far smaller than a row still cut only at row ends (a row longer than a block, COPY
escapes inside values, NULLs, empty strings); a table dropped meanwhile or a failing
consumer leaves the transaction usable for the next table, at the same snapshot.
"""

from __future__ import annotations

import psycopg2
import psycopg2.errors
import pyarrow as pa
import pytest
from psycopg2 import sql

from pgcdc_dagster.postgres import copy_blocks
from pgcdc_dagster.postgres.copy_blocks import copy_text_blocks
from pgcdc_dagster.postgres.snapshot_read import set_session

pytestmark = pytest.mark.integration

VALUES = ["plain", "", None, "tab\there", "new\nline", "back\\slash", "x" * 5000, "ünï"]


def _query(table: str) -> sql.Composable:
    return sql.SQL("SELECT id, v FROM {} ORDER BY id").format(sql.Identifier(table))


def test_blocks_cut_at_row_ends_and_failures_leave_the_snapshot_usable(pg_dsn, pg_conn,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(copy_blocks, "WRITE_BUFFER", 16)  # the sink sees a row or two at once
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        cur.execute("CREATE TABLE b (id int PRIMARY KEY, v text)")
        cur.execute("CREATE TABLE gone (id int PRIMARY KEY, v text)")
        cur.executemany("INSERT INTO a VALUES (%s, %s)", list(enumerate(VALUES)))
        cur.execute("INSERT INTO b SELECT g, 'row ' || g FROM generate_series(1, 3000) g")
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            set_session(cur)
            cur.execute("SELECT 1")  # the transaction's snapshot is taken here
        with pg_conn.cursor() as cur:  # after the snapshot: not seen by this transaction
            cur.execute("INSERT INTO b VALUES (5000, 'later')")
        for block_size in (64, 1 << 20):
            batches: list[pa.RecordBatch] = []
            copy_text_blocks(conn, _query("a"), ["id", "v"], batches.append,
                             block_size=block_size)
            rows = pa.Table.from_batches(batches)
            assert rows["v"].to_pylist() == VALUES, block_size
            assert rows["id"].to_pylist() == [str(i) for i in range(len(VALUES))]
            assert block_size > 1000 or len(batches) > 1  # several blocks were parsed

        with pg_conn.cursor() as cur:  # dropped after the snapshot was taken
            cur.execute("DROP TABLE gone")
        with pytest.raises(psycopg2.errors.UndefinedTable):
            copy_text_blocks(conn, _query("gone"), ["id", "v"], lambda b: None)

        def fail(batch: pa.RecordBatch) -> None:
            raise ValueError("consumer failed")

        with pytest.raises(ValueError, match="consumer failed"):
            copy_text_blocks(conn, _query("b"), ["id", "v"], fail, block_size=256)
        seen: list[pa.RecordBatch] = []
        copy_text_blocks(conn, _query("b"), ["id", "v"], seen.append, block_size=4096)
        ids = pa.Table.from_batches(seen)["id"].to_pylist()
        assert ids == [str(i) for i in range(1, 3001)]  # the snapshot's rows, each once
    finally:
        conn.rollback()
        conn.close()
