"""Spark as a Dagster resource: the session is opened lazily, only when a run has Spark work.

:meth:`SparkResource.lazy` is what the capture assets use: a handle that starts no Spark
(no JVM, no connection to a Spark Connect server) until a snapshot above its Spark threshold
has chunks to read or a silver batch exceeds the silver threshold, and then opens the session
in the background while the run does its other work (``spark/lazy.py``). The resource holds
the handle for the run and, in its teardown, stops what the handle opened: a Spark Connect
session is released on its server, an embedded ``local[N]`` or cluster driver stops its
application; a session the process already had running is left as it was.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field, PrivateAttr

from pgcdc_dagster.spark.lazy import LazySpark
from pgcdc_dagster.spark.session import REMOTE_ENV, env_conf, open_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The Spark session that does the data work (snapshot chunks, silver batches)."""

    master: str = Field(
        default="local[2]",
        description="Spark master URL (PGCDC_SPARK_MASTER): local[N], spark://host:7077, ...; "
        "not used when remote names a Spark Connect server.",
    )
    remote: str | None = Field(
        default=None,
        description="Spark Connect URL, e.g. sc://host:15002 (default: PGCDC_SPARK_REMOTE, "
        "read when the run opens the session). When set, the work runs on that server.",
    )
    app_name: str = Field(default="pgcdc_dagster", description="Spark application name.")
    driver_memory: str | None = Field(
        default=None, description="spark.driver.memory for a new local JVM, e.g. '2g'.")
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="Any Spark settings (spark.executor.memory, spark.ui.enabled, "
        "spark.eventLog.enabled, spark.driver.host, ...), over those of PGCDC_SPARK_CONF (a "
        "JSON object). The Delta SQL extension and catalog are refused: Delta commits go "
        "through delta-rs.",
    )
    _handle: Any = PrivateAttr(default=None)

    def effective_remote(self) -> str | None:
        """``remote``, else ``PGCDC_SPARK_REMOTE`` (None: a local or cluster master)."""
        return self.remote or os.environ.get(REMOTE_ENV) or None

    def lazy(self) -> LazySpark:
        """The session as a handle: nothing starts until a run has Spark work."""
        if self._handle is None:
            remote = self.effective_remote()
            conf = {**env_conf(), **self.conf}
            master, app, memory = self.master, self.app_name, self.driver_memory
            self._handle = LazySpark(
                lambda: open_session(master, app, conf, memory, remote=remote),
                None if remote else master)
        return self._handle  # type: ignore[no-any-return]

    def get_session(self) -> SparkSession:
        """The session, opened on first use."""
        return self.lazy().get()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """Stop what the run's handle opened (nothing when the run had no Spark work)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()
