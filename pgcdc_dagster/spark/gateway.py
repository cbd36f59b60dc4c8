"""Launching the Spark driver JVM before ``pyspark`` is imported (issue 16).

pyspark launches the driver JVM (``pyspark.java_gateway.launch_gateway``) only once the
``pyspark`` package is imported, and importing it costs ~0.2 CPU s (``pyspark.sql``, py4j;
several tenths of a second of wall time when another thread imports at the same time, as
Dagster's main thread does while the code location loads); the context's creation then
imports ``pyspark.testing.utils`` and with it pandas (~0.5 CPU s: py4j's argument converters,
registered by ``pyspark.sql.types``, import it on their first call) while the JVM waits.

:func:`spawn` starts the JVM as pyspark's launcher does (Spark's ``bin/spark-submit`` with the
settings as ``--conf`` arguments and ``PYSPARK_SUBMIT_ARGS``, default ``pyspark-shell``; the
connection-file handshake; standard input a pipe, whose end stops the JVM; SIGINT ignored),
without importing pyspark. The caller imports pyspark while the JVM starts, then
:meth:`Launch.connect` waits for the JVM's gateway and connects to it as ``launch_gateway``
does, and the context is created on that gateway (``SparkContext(gateway=...)``, pyspark's own
parameter). Only when this process has not imported pyspark and does not run under
``spark-submit`` (``PYSPARK_GATEWAY_PORT``); otherwise pyspark launches its JVM itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import SparkConf, SparkContext

_FINDER = "pgcdc_dagster._pyspark_find_spark_home"
"""pyspark's ``find_spark_home.py``, loaded on its own (its package is not imported)."""

JVM_IMPORTS = ("org.apache.spark.SparkConf", "org.apache.spark.api.java.*",
               "org.apache.spark.api.python.*", "org.apache.spark.ml.python.*",
               "org.apache.spark.mllib.api.python.*", "org.apache.spark.resource.*",
               "org.apache.spark.sql.Encoders", "org.apache.spark.sql.OnSuccessCall",
               "org.apache.spark.sql.functions", "org.apache.spark.sql.classic.*",
               "org.apache.spark.sql.api.python.*", "org.apache.spark.sql.hive.*",
               "scala.Tuple2")
"""The JVM classes ``launch_gateway`` imports into the gateway's view (pyspark 4.2)."""

POLL_SECONDS = 0.01
"""How often the JVM's connection file is looked for (``launch_gateway``: every 0.1 s)."""


def _finder() -> ModuleType:
    loaded = sys.modules.get("pyspark.find_spark_home") or sys.modules.get(_FINDER)
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("pyspark")  # a top-level package: found, not imported
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((os.path.join(p, "find_spark_home.py") for p in locations
                 if os.path.isfile(os.path.join(p, "find_spark_home.py"))), None)
    if path is None:  # an unusual installation: pyspark's own module
        return importlib.import_module("pyspark.find_spark_home")
    module_spec = importlib.util.spec_from_file_location(_FINDER, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    sys.modules[_FINDER] = module
    return module


def spark_home() -> str:
    """Spark's home as pyspark finds it (``SPARK_HOME``, else beside the installed package),
    by pyspark's own function, without importing the ``pyspark`` package."""
    return str(_finder()._find_spark_home())


def early_launch_possible() -> bool:
    """True when :func:`spawn` may start the JVM: pyspark is not imported yet (so no gateway
    exists), this process is not a ``spark-submit`` driver, and the system is POSIX."""
    return ("pyspark" not in sys.modules and "PYSPARK_GATEWAY_PORT" not in os.environ
            and os.name == "posix")


def import_converters() -> None:
    """Import what the context's first py4j call with arguments imports (py4j's converters
    registered by ``pyspark.sql.types``: ``pyspark.testing.utils``, and pandas with it), so
    that it is done while the JVM starts, not while the JVM waits for the context's calls."""
    try:
        importlib.import_module("pyspark.testing.utils")
    except Exception:  # another pyspark: its first call imports what it needs
        pass


def _connection_info(path: str) -> tuple[int, str]:
    """The gateway's port and secret, as the JVM writes them (``PythonGatewayServer``: the
    port, then the secret's length and its UTF-8 bytes; big-endian ints)."""
    with open(path, "rb") as info:
        data = info.read()
    port, size = struct.unpack_from("!ii", data)
    return port, data[8:8 + size].decode()


IGNORING_SIGINT = ("/bin/sh", "-c", 'trap "" INT; exec "$@"', "sh")
"""The command's prefix that starts it with SIGINT ignored (Ctrl-C is the driver's to handle;
an ignored signal stays ignored across ``exec``, and the JVM then installs no handler), as
pyspark's ``preexec_fn`` does, without one: Python forks a process to run a ``preexec_fn``
(15-30 ms with a few hundred MiB mapped, and more under load), and starts it with ``vfork``
otherwise."""


@dataclass
class Launch:
    """A driver JVM started by :func:`spawn`, not yet connected to."""

    process: subprocess.Popen[bytes]
    directory: str

    @property
    def info_path(self) -> str:
        return os.path.join(self.directory, "connection.info")

    def connect(self) -> Any:
        """Wait for the JVM's gateway and connect to it as pyspark's ``launch_gateway`` does
        (a py4j ``ClientServer``, or a ``JavaGateway`` when ``PYSPARK_PIN_THREAD`` is false);
        the gateway's ``proc`` is the JVM's process.

        Raises:
            PySparkRuntimeError: ``JAVA_GATEWAY_EXITED``, as pyspark's: the JVM ended before
                its gateway listened (Java missing, a setting Spark refused).
        """
        from py4j.clientserver import ClientServer, JavaParameters, PythonParameters
        from py4j.java_gateway import GatewayParameters, JavaGateway, java_import
        from pyspark.errors import PySparkRuntimeError

        try:
            while self.process.poll() is None and not os.path.isfile(self.info_path):
                time.sleep(POLL_SECONDS)
            if not os.path.isfile(self.info_path):
                raise PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})
            port, secret = _connection_info(self.info_path)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
        gateway: Any
        if os.environ.get("PYSPARK_PIN_THREAD", "true").lower() == "true":
            gateway = ClientServer(
                java_parameters=JavaParameters(port=port, auth_token=secret, auto_convert=True),
                python_parameters=PythonParameters(port=0, eager_load=False))
        else:
            gateway = JavaGateway(gateway_parameters=GatewayParameters(
                port=port, auth_token=secret, auto_convert=True))
        gateway.proc = self.process
        for name in JVM_IMPORTS:
            java_import(gateway.jvm, name)
        return gateway

    def abandon(self) -> None:
        """End this JVM (another thread's gateway came first; it has no context yet)."""
        self.process.kill()
        self.process.wait()
        if self.process.stdin is not None:
            self.process.stdin.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def context(self, conf: SparkConf) -> SparkContext:
        """The Spark context of ``conf`` on this JVM (pyspark imported now), or the context
        that exists already, another thread's (then this JVM is stopped)."""
        from pyspark import SparkContext

        with SparkContext._lock:
            fresh = SparkContext._gateway is None and SparkContext._active_spark_context is None
            if fresh:
                return SparkContext(conf=conf, gateway=self.connect())
        self.abandon()
        return SparkContext.getOrCreate(conf)


def spawn(settings: Iterable[tuple[str, str]]) -> Launch:
    """Start the driver JVM with these Spark settings (``spark.master``, ``spark.app.name``
    and the others, as ``SparkConf.getAll()`` lists them), as ``launch_gateway`` would;
    returns at once (:meth:`Launch.connect` waits for the JVM)."""
    command = [os.path.join(spark_home(), "bin", "spark-submit")]
    for key, value in settings:
        command += ["--conf", f"{key}={value}"]
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    if os.environ.get("SPARK_TESTING"):
        submit_args = f"--conf spark.ui.enabled=false {submit_args}"
    command += shlex.split(submit_args)
    directory = tempfile.mkdtemp()
    env = {**os.environ, "SPARK_CONNECT_MODE": "0",
           "_PYSPARK_DRIVER_CONN_INFO_PATH": os.path.join(directory, "connection.info")}
    try:
        process = subprocess.Popen([*IGNORING_SIGINT, *command], stdin=subprocess.PIPE,
                                   env=env)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return Launch(process, directory)
