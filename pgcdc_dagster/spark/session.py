"""Building the Spark session with the settings this project depends on.

Never sets the Delta SQL extension or catalog: no Delta jars can be loaded here, and all
Delta commits go through delta-rs (design.md §3, decision 1).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.spark.worker_daemon import DAEMON_MODULE

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

REQUIRED_CONF: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.bindAddress": "127.0.0.1",
}

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The directory holding the ``pgcdc_dagster`` package (a checkout or site-packages)."""


def cluster_conf(master: str, given: Mapping[str, str]) -> dict[str, str]:
    """Settings that give a cluster's executors the project's Python ("shared path").

    Executors run the Python the driver names (``spark.pyspark.python``, default: this
    interpreter, e.g. the venv's ``bin/python``) and import the project from
    ``spark.executorEnv.PYTHONPATH`` (default: the directory this package was loaded from).
    Both paths must exist on every worker: the same image, or a shared mount. Settings the
    user gave win; ``local[...]`` masters need none of this.
    """
    if master.startswith("local"):
        return {}
    out = {"spark.pyspark.python": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    out["spark.executorEnv.PYTHONPATH"] = PROJECT_ROOT
    return {k: v for k, v in out.items() if k not in given}


QUICK_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
"""Driver JVM options of a quick start: the JIT stops at its first tier (C1), so the JVM does
not spend seconds of CPU compiling Spark's start-up code with C2 (on a busy two-core machine
the session is up in about half the time). For runs whose Spark work is Python tasks
(snapshot chunks): the driver JVM only schedules them. Options the user gives in
``spark.driver.extraJavaOptions`` come after these (the JVM's last option wins)."""

LAUNCHER_OPTIONS_ENV = "SPARK_LAUNCHER_OPTS"
LAUNCHER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""JVM options of Spark's launcher (``spark-class`` runs ``org.apache.spark.launcher.Main``,
a JVM of its own, only to compute the driver JVM's command line, before that JVM starts):
the first JIT tier and the serial collector, as for any program that runs a fraction of a
second (its CPU 0.25-0.3 s -> 0.13-0.17 s here). Set for this process's launches unless
``SPARK_LAUNCHER_OPTS`` is set already (the user's value is kept)."""

DAEMON_MODULE_CONF = "spark.python.daemon.module"
"""Spark's setting of the Python worker daemon: ``local[...]`` sessions run this project's
(``spark/worker_daemon``: the snapshot chunks' modules imported before the workers fork);
a cluster keeps pyspark's, and a value the user gives wins."""

_FORBIDDEN = ("io.delta.sql.DeltaSparkSessionExtension",
              "org.apache.spark.sql.delta.catalog.DeltaCatalog")


def session_settings(master: str, conf: Mapping[str, str] | None = None,
                     driver_memory: str | None = None, *,
                     quick_start: bool = False, java_options: str = "") -> dict[str, str]:
    """The Spark settings :func:`build_session` gives the session (see its arguments);
    ``java_options``: driver JVM options of this project's own (the class archive's)."""
    settings = dict(REQUIRED_CONF)
    if master.startswith("local"):
        # The chunk reader's modules imported once by the daemon, not by every worker.
        settings[DAEMON_MODULE_CONF] = DAEMON_MODULE
    else:
        settings.pop("spark.driver.bindAddress")
        settings.update(cluster_conf(master, conf or {}))
    if driver_memory:
        settings["spark.driver.memory"] = driver_memory
    for key, value in (conf or {}).items():
        if any(f in value for f in _FORBIDDEN):
            raise ValueError(f"{key}={value}: Delta Spark classes are not used; delta-rs commits")
        settings[key] = value
    ours = " ".join(o for o in (QUICK_START_JAVA_OPTIONS if quick_start else "", java_options)
                    if o)
    if ours:
        given = settings.get("spark.driver.extraJavaOptions", "")
        settings["spark.driver.extraJavaOptions"] = f"{ours} {given}".strip()
    return settings


def check_master(master: str) -> None:
    """Refuse a master URL Spark cannot use (its own rule: ``yarn``, or ``spark``, ``k8s`` or
    ``local`` first) before a JVM starts, with the setting to fix; Spark's JVM would exit and
    PySpark report only ``JAVA_GATEWAY_EXITED``."""
    if master != "yarn" and not master.startswith(("spark", "k8s", "local")):
        raise ConfigurationError(
            f"{master!r} is not a Spark master URL (PGCDC_SPARK_MASTER, the spark resource's "
            "master): use local[N], spark://host:7077, k8s://https://host:port or yarn."
        )


def launcher_java_options() -> str:
    """:data:`LAUNCHER_JAVA_OPTIONS`, with the launcher's class archive when there is one
    (``spark/class_archive.py``)."""
    from pgcdc_dagster.spark.class_archive import launcher_options

    return " ".join(o for o in (LAUNCHER_JAVA_OPTIONS, launcher_options()) if o)


def _environment(master: str) -> None:
    if LAUNCHER_OPTIONS_ENV not in os.environ:
        os.environ[LAUNCHER_OPTIONS_ENV] = launcher_java_options()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def _settings(master: str, conf: Mapping[str, str] | None, driver_memory: str | None,
              quick_start: bool, class_archive: bool) -> dict[str, str]:
    """:func:`session_settings` with this project's driver JVM options: the class archive's
    (``spark/class_archive.py``) and a one-run process's scratch directory
    (``spark/release.py``)."""
    from pgcdc_dagster.spark.class_archive import java_options
    from pgcdc_dagster.spark.release import scratch_settings

    scratch, scratch_options = scratch_settings(master, conf)
    options = " ".join(o for o in (java_options() if class_archive else "", scratch_options)
                       if o)
    return session_settings(master, {**scratch, **(conf or {})}, driver_memory,
                            quick_start=quick_start, java_options=options)


def build_context(master: str = "local[2]", app_name: str = "pgcdc_dagster",
                  conf: Mapping[str, str] | None = None,
                  driver_memory: str | None = None, *,
                  quick_start: bool = False, class_archive: bool = True) -> SparkContext:
    """Create (or reuse) the Spark context alone, with :func:`build_session`'s settings (the
    SQL ones too: a session built on it later takes them as its defaults).

    Work that is only Python tasks (snapshot chunks, ``spark/snapshot_tasks.py``) needs no
    SQL session, whose creation costs the driver's JVM about 0.9 CPU s more (measured:
    context 1.2 CPU s, context and session 2.1); :func:`build_session` later reuses this
    context. A context of another master already running is stopped and replaced.
    """
    check_master(master)
    from pgcdc_dagster.spark import gateway

    _environment(master)
    settings = [("spark.master", master), ("spark.app.name", app_name),
                *_settings(master, conf, driver_memory, quick_start, class_archive).items()]
    # The JVM first, then pyspark's imports while it starts (spark/gateway.py).
    launch = gateway.spawn(settings) if gateway.early_launch_possible() else None
    from pyspark import SparkConf, SparkContext

    gateway.import_converters()
    spark_conf = SparkConf()
    for key, value in settings:
        spark_conf.set(key, value)
    context = launch.context(spark_conf) if launch else SparkContext.getOrCreate(spark_conf)
    if context.master != master:  # see build_session
        context.stop()
        context = SparkContext.getOrCreate(spark_conf)
    context.setLogLevel("ERROR")
    return context


def build_session(master: str = "local[2]", app_name: str = "pgcdc_dagster",
                  conf: Mapping[str, str] | None = None,
                  driver_memory: str | None = None, *,
                  quick_start: bool = False, class_archive: bool = True) -> SparkSession:
    """Create (or reuse) the Spark session.

    Args:
        master: Spark master URL, e.g. ``local[2]`` or ``spark://host:7077``.
        app_name: application name shown in the Spark UI.
        conf: extra Spark settings; they may not enable the Delta extension or catalog.
        driver_memory: ``spark.driver.memory`` (only effective for a new JVM).
        quick_start: a new driver JVM gets :data:`QUICK_START_JAVA_OPTIONS` (the session
            is for Python tasks, e.g. snapshot chunks).
        class_archive: a new driver JVM maps the class archive when there is one
            (``spark/class_archive.py``).
    """
    check_master(master)
    from pgcdc_dagster.spark import gateway

    if gateway.early_launch_possible():
        # The JVM first, pyspark imported while it starts (spark/gateway.py): the context of
        # the same settings, on which the builder makes the session (as it does on a quick
        # context that a run started first).
        build_context(master, app_name, conf, driver_memory, quick_start=quick_start,
                      class_archive=class_archive)
    from pyspark.sql import SparkSession

    _environment(master)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in _settings(master, conf, driver_memory, quick_start,
                                class_archive).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if session.sparkContext.master != master:
        # The JVM already runs a session of another master (one started before the run from
        # PGCDC_SPARK_MASTER while the run's resource names another): getOrCreate would hand
        # that one back and the work would run where the user did not ask for it.
        session.stop()
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
