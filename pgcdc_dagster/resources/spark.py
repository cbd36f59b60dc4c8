"""Spark as a Dagster resource: the session is created lazily, only when a run has Spark work.

:meth:`SparkResource.lazy` is what the capture assets use: a handle that starts no JVM until a
snapshot has chunks to read or a silver batch exceeds the Spark threshold, and then builds the
session in the background while the run does its other work (``spark/lazy.py``).

The handle is shared by the process (one per settings; a JVM is one per process anyway), so a
start asked for before the run (``spark/prestart.py``: a process started to execute the
``initial_snapshot`` job starts the JVM while Dagster loads the code location and creates the
run) is the one the run's snapshot uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field, PrivateAttr

from pgcdc_dagster.spark.lazy import LazySpark
from pgcdc_dagster.spark.prestart import shared_handle

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

class SparkResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The Spark session that does the data work (snapshot chunks, silver batches)."""

    master: str = Field(
        default="local[2]",
        description="Spark master URL (PGCDC_SPARK_MASTER): local[N], spark://host:7077, ...",
    )
    app_name: str = Field(default="pgcdc_dagster", description="Spark application name.")
    driver_memory: str | None = Field(
        default=None, description="spark.driver.memory for a new local JVM, e.g. '2g'.")
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Spark settings. The Delta SQL extension and catalog are refused: "
        "Delta commits go through delta-rs.",
    )
    _handle: Any = PrivateAttr(default=None)

    def lazy(self) -> LazySpark:
        """The session as a handle: nothing starts until a run has Spark work."""
        if self._handle is None:
            self._handle = shared_handle(self.master, self.app_name, self.conf,
                                         self.driver_memory)
        return self._handle  # type: ignore[no-any-return]

    def get_session(self) -> SparkSession:
        """The session, built on first use."""
        return self.lazy().get()
