"""Building the Spark session with the settings this project depends on.

One code path for every kind of Spark: an embedded ``local[N]`` session, a cluster master
(``spark://``, ``k8s://``, ``yarn``) and a Spark Connect server (``sc://host:15002``). Only
public pyspark API: the builder, ``SparkSession.addArtifacts``, ``SparkSession.stop``.

Never sets the Delta SQL extension or catalog: no Delta jars can be loaded here, and all
Delta commits go through delta-rs (design.md §3, decision 1).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pgcdc_dagster.exceptions import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SQL_CONF: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
"""Session settings the project's Spark work depends on (set on every kind of session;
a Spark Connect session sets them on its server-side session)."""

CLASSIC_CONF: Mapping[str, str] = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.log.level": "ERROR",
}
"""Defaults of a session whose driver runs in this process (``local[N]``, a cluster master);
any of them, and any other Spark setting, can be given in the ``conf`` mapping."""
LOCAL_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.driver.bindAddress": "127.0.0.1",
}
"""Defaults of an embedded ``local[N]`` session: no UI (``spark.ui.enabled=true`` turns it
on), the driver on loopback."""

REQUIRED_CONF: Mapping[str, str] = {**SQL_CONF, **CLASSIC_CONF, **LOCAL_CONF}
"""Every default of a ``local[N]`` session."""

CONF_ENV = "PGCDC_SPARK_CONF"
"""Spark settings from the environment: a JSON object (``{"spark.executor.memory": "2g"}``);
the ``spark`` resource's ``conf`` mapping wins over it key by key."""
REMOTE_ENV = "PGCDC_SPARK_REMOTE"
"""A Spark Connect URL (``sc://host:15002``) from the environment: when set (and the resource
names no ``remote``), the session is a Spark Connect session and the master is not used."""

PACKAGE = "pgcdc_dagster"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""The ``pgcdc_dagster`` package directory the driver imported (a checkout or site-packages):
what :func:`package_archive` ships to the executors."""

_FORBIDDEN = ("io.delta.sql.DeltaSparkSessionExtension",
              "org.apache.spark.sql.delta.catalog.DeltaCatalog")


def env_conf(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of :data:`CONF_ENV` (empty when unset), with an error naming the
    variable when it is not a JSON object of strings."""
    text = (os.environ if environ is None else environ).get(CONF_ENV, "").strip()
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"{CONF_ENV} is not JSON ({exc}): give an object such as "
                                 '{"spark.executor.memory": "2g"}') from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"{CONF_ENV} must be a JSON object of Spark settings, "
                                 'e.g. {"spark.executor.memory": "2g"}')
    return {str(k): str(v) for k, v in data.items()}


def session_settings(master: str, conf: Mapping[str, str] | None = None,
                     driver_memory: str | None = None, *, remote: str | None = None
                     ) -> dict[str, str]:
    """The Spark settings :func:`build_session` gives the session (see its arguments): the
    project's defaults for the kind of session, then the user's ``conf`` (which wins)."""
    if remote:
        settings = dict(SQL_CONF)
    else:
        settings = {**SQL_CONF, **CLASSIC_CONF}
        if master.startswith("local"):
            settings.update(LOCAL_CONF)
        else:
            settings["spark.pyspark.python"] = os.environ.get("PYSPARK_PYTHON", sys.executable)
        if driver_memory:
            settings["spark.driver.memory"] = driver_memory
    for key, value in (conf or {}).items():
        if any(f in value for f in _FORBIDDEN):
            raise ValueError(f"{key}={value}: Delta Spark classes are not used; delta-rs commits")
        settings[key] = value
    return settings


def check_master(master: str) -> None:
    """Refuse a master URL Spark cannot use (its own rule: ``yarn``, or ``spark``, ``k8s`` or
    ``local`` first) before a JVM starts, with the setting to fix; Spark's JVM would exit and
    PySpark report only ``JAVA_GATEWAY_EXITED``."""
    if master != "yarn" and not master.startswith(("spark", "k8s", "local")):
        raise ConfigurationError(
            f"{master!r} is not a Spark master URL (PGCDC_SPARK_MASTER, the spark resource's "
            "master): use local[N], spark://host:7077, k8s://https://host:port or yarn; "
            "a Spark Connect server is named by PGCDC_SPARK_REMOTE (sc://host:15002)."
        )


def check_remote(remote: str) -> None:
    """Refuse a Spark Connect URL that is not ``sc://host[:port][/;params]``."""
    if not remote.startswith("sc://") or len(remote) <= len("sc://"):
        raise ConfigurationError(
            f"{remote!r} is not a Spark Connect URL (PGCDC_SPARK_REMOTE, the spark resource's "
            "remote): use sc://host:15002")


def package_archive(directory: str | Path) -> Path:
    """A zip of the ``pgcdc_dagster`` package the driver runs (its Python sources), written
    under ``directory``: what the executors of a cluster or a Spark Connect server import
    (``SparkSession.addArtifacts(..., pyfile=True)``), so that they run the driver's code
    whatever is installed on the workers. The workers' Python needs the dependencies."""
    path = Path(directory) / f"{PACKAGE}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for root, dirs, files in os.walk(PACKAGE_DIR):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            # A directory entry of its own: Python 3.11's zipimport finds a namespace
            # package (``pgcdc_dagster`` has no ``__init__``) only by one.
            relative = Path(root).relative_to(PACKAGE_DIR).as_posix()
            archive.writestr(f"{PACKAGE}/" if relative == "." else f"{PACKAGE}/{relative}/", b"")
            for name in sorted(files):
                if name.endswith((".py", ".typed")):
                    full = Path(root) / name
                    archive.write(full, f"{PACKAGE}/{full.relative_to(PACKAGE_DIR)}")
    return path


@dataclass
class Opened:
    """A session and what :func:`open_session` did to get it."""

    session: SparkSession
    owned: bool
    """True when this call created it (its owner stops it: :meth:`close`)."""
    kind: str
    """``local``, ``cluster`` or ``connect``."""
    scratch: Path | None = field(default=None, repr=False)

    def close(self) -> None:
        """Stop the session if it was opened here (a Spark Connect session is released on
        its server; an embedded or cluster driver stops its application), then remove the
        package archive."""
        try:
            if self.owned:
                self.session.stop()
        finally:
            if self.scratch is not None:
                shutil.rmtree(self.scratch, ignore_errors=True)
                self.scratch = None


def _existing_classic(master: str) -> SparkSession | None:
    """The process's running classic session of ``master`` (public ``SparkSession.active``),
    or None."""
    from pyspark.sql import SparkSession

    try:
        session = SparkSession.active()
    except Exception:  # none (PySparkRuntimeError NO_ACTIVE_OR_DEFAULT_SESSION)
        return None
    try:
        running = session.conf.get("spark.master")
    except Exception:  # a stopped session, or a Spark Connect one
        return None
    return session if running == master else None


def open_session(master: str = "local[2]", app_name: str = "pgcdc_dagster",
                 conf: Mapping[str, str] | None = None, driver_memory: str | None = None,
                 *, remote: str | None = None) -> Opened:
    """Create the Spark session (or reuse the process's running one of the same local or
    cluster master, which is then not this caller's to stop).

    Args:
        master: Spark master URL, e.g. ``local[2]`` or ``spark://host:7077`` (unused with
            ``remote``).
        app_name: application name shown in the Spark UI.
        conf: extra Spark settings (any; they may not enable the Delta extension or catalog).
        driver_memory: ``spark.driver.memory`` (only effective for a new driver JVM).
        remote: a Spark Connect URL (``sc://host:15002``): a new Spark Connect session.
    """
    from pyspark.sql import SparkSession

    if remote:
        check_remote(remote)
    else:
        check_master(master)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            existing = _existing_classic(master)
            if existing is not None:
                return Opened(existing, owned=False, kind="local")
    settings = session_settings(master, conf, driver_memory, remote=remote)
    builder = SparkSession.builder.appName(app_name)
    builder = builder.remote(remote) if remote else builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    if remote:
        session = builder.create()  # a session of its own on the server, released by close
        kind = "connect"
    else:
        session = builder.getOrCreate()
        if session.conf.get("spark.master") != master:
            # The process runs a session of another master: getOrCreate handed that one
            # back, and the work would run where the user did not ask for it.
            session.stop()
            session = builder.getOrCreate()
        kind = "local" if master.startswith("local") else "cluster"
    opened = Opened(session, owned=True, kind=kind)
    if kind != "local":
        try:
            opened.scratch = Path(tempfile.mkdtemp(prefix="pgcdc-artifacts-"))
            session.addArtifacts(str(package_archive(opened.scratch)), pyfile=True)
        except BaseException:
            opened.close()
            raise
    return opened


def build_session(master: str = "local[2]", app_name: str = "pgcdc_dagster",
                  conf: Mapping[str, str] | None = None,
                  driver_memory: str | None = None, *, remote: str | None = None
                  ) -> SparkSession:
    """The session of :func:`open_session` (for callers that manage its life themselves:
    tests, benchmarks; ``SparkSession.stop`` ends it)."""
    return open_session(master, app_name, conf, driver_memory, remote=remote).session
