"""What one orchestrated run hands the engine: :class:`RunContext`, built once per run.

The orchestration layer (the Dagster resources of :mod:`pgcdc_dagster.resources`) builds it
at the start of a run from its resources: the engine's settings, the Spark handle (nothing
starts until a run has Spark work), the tables the definitions capture and the source as it
may be named in logs. The runner's entry points take it, so a run's bronze step and its
silver catch-up work from the same settings and tables, and an engine change that needs
more of the run (a connection pool, the catalog read once) adds it here, not to each call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pgcdc_dagster.capture.runner import BronzeRun, apply_silver_tables, run_bronze
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.silver_apply import SilverReport
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.spark.lazy import SparkLike


@dataclass(frozen=True)
class RunContext:
    """One run's settings, Spark handle and captured tables (see the module)."""

    settings: CaptureSettings
    spark: SparkLike
    tables: frozenset[tuple[str, str]]
    """The ``(schema, table)`` pairs the definitions capture (the run's selection)."""
    source: str
    """The source as it may be logged: host, port, database, user (never the password)."""
    run_id: str

    def bronze(self, *, force_snapshot_step: bool, progress: Callable[[str], None],
               on_committed: Callable[[BronzeRun], None] | None = None,
               after_snapshot: Callable[[], None] | None = None) -> BronzeRun:
        """The bronze step of the run's tables (:func:`~pgcdc_dagster.capture.runner.
        run_bronze`)."""
        return run_bronze(self.settings, self.spark, force_snapshot_step=force_snapshot_step,
                          only=self.tables, progress=progress, on_committed=on_committed,
                          after_snapshot=after_snapshot)

    def silver(self, contexts: Sequence[TableContext]) -> list[SilverReport]:
        """Silver catch-up of ``contexts``, with the run's threshold and file size."""
        return apply_silver_tables(contexts, self.spark,
                                   self.settings.silver_spark_threshold_rows,
                                   self.settings.target_file_bytes,
                                   self.settings.silver_batch_rows)


__all__ = ["RunContext"]
