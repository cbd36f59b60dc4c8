"""Snapshot chunks as Spark tasks: each task COPYs one chunk inside the exported snapshot and
writes bronze and silver Parquet files straight into the Delta table directories.

The driver commits the returned files through delta-rs; a task never commits. Memory per task
is bounded by one CSV block, whatever the chunk's size.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.envelope import SourceIdentity, bronze_from_snapshot, bronze_schema
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.lake.delta import DataFile, describe_file
from pgcdc_dagster.lake.silver import META_FIELDS, silver_schema
from pgcdc_dagster.postgres.snapshot_read import Chunk, chunk_query, read_text_batches

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class ChunkTask:
    """Everything one Spark task needs (it is pickled to the worker)."""

    dsn: str
    snapshot_name: str | None
    chunk: Chunk
    relation: Relation
    converters: tuple[ColumnConverter, ...]
    bronze_root: str
    silver_root: str
    ident: SourceIdentity
    lsn: int
    snapshot_marker: str
    processed_ms: int

    def __repr__(self) -> str:  # never print the DSN
        return f"ChunkTask({self.chunk})"


@dataclass(frozen=True)
class ChunkResult:
    """Files one task wrote, and how many rows."""

    chunk: Chunk
    rows: int
    bronze: DataFile | None
    silver: DataFile | None
    seconds: float


def _silver_batch(task: ChunkTask, text: pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    n = text.num_rows
    cols = [conv.to_silver(text.column(i)) for i, conv in enumerate(task.converters)]
    meta = [
        pa.array(["r"] * n), pa.array([task.lsn] * n, pa.int64()),
        pa.array([task.lsn] * n, pa.int64()), pa.array([0] * n, pa.int64()),
        pa.array([task.processed_ms] * n, pa.int64()), pa.array([False] * n),
    ]
    assert len(meta) == len(META_FIELDS)
    return pa.Table.from_arrays([*cols, *meta], schema=schema)


def run_chunk(task: ChunkTask) -> ChunkResult:
    """Read one chunk and write its bronze and silver Parquet files (runs on a worker)."""
    started = time.monotonic()
    columns = [c.name for c in task.relation.columns]
    b_schema = bronze_schema(task.relation, task.converters)
    s_schema = silver_schema(task.relation, task.converters)
    name = f"part-snap-{task.chunk.index:05d}-{uuid.uuid4().hex}.parquet"
    b_path = os.path.join(task.bronze_root, name)
    s_path = os.path.join(task.silver_root, name)
    rows = 0
    b_writer: pq.ParquetWriter | None = None
    s_writer: pq.ParquetWriter | None = None
    try:
        query = chunk_query(task.chunk, columns)
        for batch in read_text_batches(task.dsn, task.snapshot_name, query, columns):
            if batch.num_rows == 0:
                continue
            if b_writer is None:
                b_writer = pq.ParquetWriter(b_path, b_schema, compression="zstd")
                s_writer = pq.ParquetWriter(s_path, s_schema, compression="zstd")
            b_writer.write_table(bronze_from_snapshot(
                task.relation, task.converters, batch, task.ident, lsn=task.lsn,
                snapshot=task.snapshot_marker, processed_ms=task.processed_ms))
            assert s_writer is not None
            s_writer.write_table(_silver_batch(task, batch, s_schema))
            rows += batch.num_rows
    finally:
        if b_writer is not None:
            b_writer.close()
        if s_writer is not None:
            s_writer.close()
    if rows == 0:
        return ChunkResult(task.chunk, 0, None, None, time.monotonic() - started)
    return ChunkResult(
        task.chunk, rows,
        describe_file(task.bronze_root, name, rows),
        describe_file(task.silver_root, name, rows),
        time.monotonic() - started,
    )


def run_chunks(spark: SparkSession, tasks: Sequence[ChunkTask]) -> list[ChunkResult]:
    """Run the tasks in parallel on the Spark executors; results in task order."""
    if not tasks:
        return []
    rdd = spark.sparkContext.parallelize(list(tasks), len(tasks))
    return list(rdd.map(run_chunk).collect())
