"""Ending a one-run process's Spark JVM at the process's exit, without the JVM's slow exit.

A process started to execute one run (``dagster job execute -j NAME``, or the run worker
``dagster api execute_run``: :func:`~pgcdc_dagster.spark.prestart.job_of_process`) used to
leave its Spark JVM to end by itself: it notices that Python has exited (its standard input
closes), then runs its shutdown hooks, Spark's stop among them, and exits, about 0.5 s later
on this machine (issue 16: the last half second of a snapshot as a user waits for it; a
shell or an orchestrator reading the process's output waits for the JVM too).

Such a process instead ends it itself (:func:`enable`), as soon as the run's Spark work is
over (:func:`spark_work_done`, on a thread, while the run reports and Dagster finishes), at
the latest from an exit handler: Spark's own stop first
(``JavaSparkContext.stop``: its jobs, the Python daemon and workers, the block manager, an
event log if the user enabled one), then the JVM is killed rather than left to run its exit
hooks, whose remaining work is deleting its scratch files: a local master's JVM of such a
process keeps them in a directory of its own (``spark.local.dir`` and ``java.io.tmpdir``;
the JVM's performance-data file is off), which the handler removes. A JVM that does not stop
within :data:`STOP_TIMEOUT` seconds is killed all the same. A local dir the user set
(``spark.local.dir``, ``SPARK_LOCAL_DIRS``) is kept and left to the JVM's own hooks.

Other processes (a code server, ``dagster dev``, ``execute_in_process`` in a test or a
notebook) share the session across runs and are left as they were.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STOP_TIMEOUT = 10.0
"""Seconds Spark's stop may take before the JVM is killed without it."""
SCRATCH_PREFIX = "pgcdc-spark-"
"""The name of a one-run process's JVM scratch directory starts so (under ``TMPDIR``)."""
LOCAL_DIR_CONF = "spark.local.dir"


class _Release:
    """The process's choice (:func:`enable`), its JVM's scratch directory, and the thread
    ending the JVM once the run's Spark work is over (:func:`spark_work_done`)."""

    def __init__(self) -> None:
        self.enabled = False
        self.scratch: Path | None = None
        self.ending: threading.Thread | None = None
        self.lock = threading.Lock()


_STATE = _Release()
_ENDING = threading.Lock()


def enable() -> None:
    """Make this process end its Spark JVM at exit (a one-run process; idempotent)."""
    with _STATE.lock:
        if not _STATE.enabled:
            _STATE.enabled = True
            atexit.register(_at_exit)


def spark_work_done() -> None:
    """The run's Spark work is over (the capture op, alone in its job, has merged silver):
    in a one-run process, end the JVM on a thread while the run reports and Dagster
    finishes, instead of at exit. Nothing in other processes."""
    with _STATE.lock:
        if not _STATE.enabled or _STATE.ending is not None:
            return
        _STATE.ending = threading.Thread(target=release, daemon=True,
                                         name="pgcdc-spark-release")
        _STATE.ending.start()


def _at_exit() -> None:
    with _STATE.lock:
        ending = _STATE.ending
    if ending is not None:
        ending.join(STOP_TIMEOUT + 5)
    release()


def enabled() -> bool:
    return _STATE.enabled


def scratch_settings(master: str, conf: Mapping[str, str] | None) -> tuple[dict[str, str], str]:
    """The settings and driver JVM options that give a one-run process's local JVM a scratch
    directory of its own (created here); nothing otherwise, or when the user chose one."""
    if not _STATE.enabled or not master.startswith("local"):
        return {}, ""
    if LOCAL_DIR_CONF in (conf or {}) or os.environ.get("SPARK_LOCAL_DIRS"):
        return {}, ""
    with _STATE.lock:
        if _STATE.scratch is None:
            _STATE.scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        scratch = _STATE.scratch
    return ({LOCAL_DIR_CONF: str(scratch)},
            f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData")


def _ignore_error(*_args: object) -> None:
    """The accumulator server's error report, silenced once the JVM is being ended (its end
    of their connection closes: not an error)."""


def release() -> None:
    """Stop the process's Spark context, kill its JVM and remove its scratch directory.
    A process without a running context only loses the (empty) directory."""
    if not _ENDING.acquire(timeout=STOP_TIMEOUT + 5):  # the other caller is stuck: leave it
        return
    try:
        pyspark = sys.modules.get("pyspark")  # a run without Spark work never imported it
        context: Any = getattr(getattr(pyspark, "SparkContext", None),
                               "_active_spark_context", None)
        if context is not None and getattr(context, "_jsc", None) is not None:
            _end(context)
        remove_scratch()
    finally:
        _ENDING.release()


def remove_scratch() -> None:
    """Remove the JVM's scratch directory (once its JVM is gone)."""
    with _STATE.lock:
        scratch, _STATE.scratch = _STATE.scratch, None
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


def _end(context: Any) -> None:
    proc = getattr(context._gateway, "proc", None)
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.server_shutdown = True
        server.handle_error = _ignore_error
    stopper = threading.Thread(target=_stop_quietly, args=(context,), daemon=True,
                               name="pgcdc-spark-stop")
    stopper.start()
    stopper.join(STOP_TIMEOUT)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    context._jsc = None
    SparkContext = type(context)
    with SparkContext._lock:
        SparkContext._active_spark_context = None


def _stop_quietly(context: Any) -> None:
    try:
        context._jsc.stop()
    except Exception:  # a JVM already gone: there is nothing left to stop
        pass
