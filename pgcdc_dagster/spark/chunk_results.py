"""How the one-job snapshot mode reports chunks as they finish: an accumulator of results.

Its own module so that pyspark is imported only where Spark works (``snapshot_tasks``
imports it when it runs chunks): a micro-batch without snapshot chunks never loads pyspark.
"""

from __future__ import annotations

from pyspark.accumulators import Accumulator, AccumulatorParam

from pgcdc_dagster.spark.snapshot_tasks import ChunkResult, Unit, chunks_of, run_unit


class ChunkResults(AccumulatorParam):  # type: ignore[type-arg]
    """Accumulates :class:`ChunkResult` lists; Spark merges a task's update on the driver as
    soon as the task finishes, which is how one job reports its chunks one by one."""

    def zero(self, value: list[ChunkResult]) -> list[ChunkResult]:
        return []

    def addInPlace(self, value1: list[ChunkResult],
                   value2: list[ChunkResult]) -> list[ChunkResult]:
        value1.extend(value2)
        return value1


class Reported:
    """The task function of the one-job mode: run the chunk, report it through ``results``."""

    def __init__(self, results: Accumulator[list[ChunkResult]]) -> None:
        self.results = results

    def __call__(self, unit: Unit) -> int:
        self.results.add(run_unit(unit))
        return len(chunks_of(unit))
