"""Spark as a Dagster resource: the session is created lazily, once per process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field, PrivateAttr

from pgcdc_dagster.spark.session import build_session

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
    _session: Any = PrivateAttr(default=None)

    def get_session(self) -> SparkSession:
        """The session, built on first use."""
        if self._session is None:
            self._session = build_session(self.master, self.app_name, self.conf,
                                          self.driver_memory)
        return self._session  # type: ignore[no-any-return]
