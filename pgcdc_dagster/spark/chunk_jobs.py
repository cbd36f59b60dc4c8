"""Running snapshot chunk units as DataFrame work, or in this process.

On Spark, each unit (a chunk, or a group of small tables' chunks: ``snapshot_tasks.Unit``)
is a one-row DataFrame of its specification processed with ``mapInArrow``
(:func:`unit_results`): the executor runs :func:`~pgcdc_dagster.spark.snapshot_tasks.run_unit`
and returns one row per chunk (the files it wrote, its row count, the error that stopped it,
the executor process that ran it), which the driver collects. Only the DataFrame API: the same
code runs on an embedded ``local[N]`` session, a cluster and a Spark Connect server. Units are
submitted from as many driver threads as the session has task slots (or
``snapshot.max.threads``), biggest first, so results flow back as each unit finishes and the
driver records and commits tables while the others are read.

Below the snapshot's Spark threshold the same units run on threads of this process
(:func:`run_units_here`), without Spark.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pgcdc_dagster.spark.snapshot_tasks import (
    ChunkError,
    ChunkResult,
    ChunkTask,
    SnapshotFile,
    Unit,
    chunks_of,
    run_unit,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pgcdc_dagster.spark.lazy import LazySpark

RESULT_FIELDS = pa.schema([
    ("position", pa.int32()), ("rows", pa.int64()), ("seconds", pa.float64()),
    ("bronze", pa.string()), ("silver", pa.string()), ("error_kind", pa.string()),
    ("error_message", pa.string()), ("executor", pa.string()),
])
RESULT_SCHEMA = ("position int, rows bigint, seconds double, bronze string, silver string, "
                 "error_kind string, error_message string, executor string")
"""One row per chunk of the unit: its position in the unit, rows read, seconds, the bronze
file and the silver files written (JSON), the error that stopped it, and ``host:pid`` of the
Python worker that ran it."""
JOB_TAG_PREFIX = "pgcdc-snapshot-"


def _executor() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def result_row(position: int, result: ChunkResult, executor: str) -> dict[str, Any]:
    error = result.error
    return {"position": position, "rows": result.rows, "seconds": result.seconds,
            "bronze": json.dumps(result.bronze.to_json()) if result.bronze else None,
            "silver": json.dumps([f.to_json() for f in result.silver]),
            "error_kind": error.kind if error else None,
            "error_message": error.message if error else None, "executor": executor}


def from_row(unit: Unit, row: Any) -> ChunkResult:
    """The :class:`ChunkResult` of a result row (a ``Row`` or a mapping) of ``unit``."""

    def get(name: str) -> Any:
        return row[name]

    task = chunks_of(unit)[int(get("position"))]
    bronze = get("bronze")
    error = ChunkError(get("error_kind"), get("error_message") or "") \
        if get("error_kind") else None
    return ChunkResult(task.chunk, task.lsn, int(get("rows")),
                       SnapshotFile.from_json(json.loads(bronze)) if bronze else None,
                       tuple(SnapshotFile.from_json(f) for f in json.loads(get("silver"))),
                       float(get("seconds")), error, executor=get("executor") or "")


def unit_results(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function (runs in the executors): run each unit of the input, yield its
    chunks' result rows."""
    executor = _executor()
    for batch in batches:
        for blob in batch.column(0).to_pylist():
            unit = pickle.loads(blob)
            rows = [result_row(i, r, executor) for i, r in enumerate(run_unit(unit))]
            yield pa.RecordBatch.from_pylist(rows, schema=RESULT_FIELDS)


def _slot_of(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function of :func:`start_workers`: the task's partition (this module,
    and the chunk reader's, are now imported in the worker)."""
    from pyspark import TaskContext

    for _ in batches:
        pass
    context = TaskContext.get()
    yield pa.RecordBatch.from_pydict(
        {"slot": pa.array([context.partitionId() if context else 0], pa.int32()),
         "executor": pa.array([_executor()], pa.string())})


def start_workers(spark: SparkSession) -> int:
    """Run one task per task slot of the session (``spark.range`` splits into the default
    parallelism): the Python workers start and import the chunk reader before the chunks'
    jobs come. Returns the number of slots."""
    rows = spark.range(0, 1 << 12).mapInArrow(_slot_of, "slot int, executor string").collect()
    return max(1, len({r["slot"] for r in rows}))


def _unit_job(spark: SparkSession, unit: Unit, tag: str) -> list[ChunkResult]:
    spark.addTag(tag)
    try:
        frame = spark.createDataFrame(pa.table({"unit": pa.array([pickle.dumps(unit)],
                                                                  pa.binary())}))
        rows = frame.mapInArrow(unit_results, RESULT_SCHEMA).collect()
    finally:
        spark.removeTag(tag)
    return [from_row(unit, row) for row in rows]


def run_chunks(spark: SparkSession | LazySpark, tasks: Sequence[Unit],
               on_result: Callable[[ChunkResult], None], *, parallelism: int = 0,
               proceed: Callable[[ChunkTask], bool] = lambda _task: True,
               on_drained: Callable[[], None] | None = None) -> int:
    """Run the units on the Spark executors, calling ``on_result`` as each chunk finishes;
    return the number of Spark tasks run (one per unit).

    ``on_result`` runs on the calling thread, one result at a time; ``on_drained`` after each
    unit's results (the caller records and commits them in bulk there). Units are submitted
    in order from ``parallelism`` driver threads (0, or more than the session's task slots:
    as many as the slots), each a Spark job of one task; a unit for which ``proceed`` says
    False for all its chunks when its turn comes is skipped, and on an error the jobs under
    way are interrupted (``SparkSession.interruptTag``).
    """
    from pgcdc_dagster.spark.lazy import LazySpark

    handle = LazySpark.of(spark)
    slots = handle.parallelism()
    session = handle.get()
    workers = min(parallelism, slots) if parallelism > 0 else slots
    tag = f"{JOB_TAG_PREFIX}{uuid.uuid4().hex[:8]}"
    return _dispatch(tasks, lambda unit: _unit_job(session, unit, tag), on_result, workers,
                     proceed, on_drained, lambda: session.interruptTag(tag))


def run_units_here(tasks: Sequence[Unit], on_result: Callable[[ChunkResult], None], *,
                   parallelism: int, proceed: Callable[[ChunkTask], bool] = lambda _t: True,
                   on_drained: Callable[[], None] | None = None) -> int:
    """:func:`run_chunks` without Spark: the units on ``parallelism`` threads of this process
    (a small snapshot, below ``snapshot_spark_threshold_rows``). Returns 0 (no Spark task)."""
    _dispatch(tasks, run_unit, on_result, max(1, parallelism), proceed, on_drained, None)
    return 0


def _dispatch(tasks: Sequence[Unit], run: Callable[[Unit], list[ChunkResult]],
              on_result: Callable[[ChunkResult], None], workers: int,
              proceed: Callable[[ChunkTask], bool], on_drained: Callable[[], None] | None,
              interrupt: Callable[[], object] | None) -> int:
    if not tasks:
        return 0
    drained = on_drained or (lambda: None)
    ran = [0]

    def submit(unit: Unit) -> list[ChunkResult]:
        if not any(proceed(t) for t in chunks_of(unit)):
            return []
        ran[0] += 1
        return run(unit)

    with ThreadPoolExecutor(max_workers=max(1, workers),
                            thread_name_prefix="pgcdc-chunks") as pool:
        futures: list[Future[list[ChunkResult]]] = [pool.submit(submit, t) for t in tasks]
        try:
            for future in as_completed(futures):
                for result in future.result():
                    on_result(result)
                drained()
        except BaseException:
            for f in futures:
                f.cancel()
            if interrupt is not None:
                try:
                    interrupt()
                except Exception:  # the session is gone: nothing runs any more
                    pass
            raise
    return ran[0]
