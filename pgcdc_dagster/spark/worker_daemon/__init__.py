"""The Python worker daemon of this project's local Spark sessions: pyspark's own daemon,
with the snapshot chunks' modules imported once before it forks its workers.

Spark starts one daemon per executor (``python -m <spark.python.daemon.module>``) on the
first Python task, and the daemon forks a worker per task slot. pyspark's daemon imports
nothing of the task's code, so every new worker imported the chunk reader (pyarrow and its
Parquet writer, numpy, psycopg2, the binary decoder: ~0.25 s each, twice that on a busy
machine, then pandas in its first chunk: 0.3 s more) while the first chunks waited. In an
``initial_snapshot`` process the daemon starts while Dagster is still setting up the run
(``spark/prestart.py``), so these imports are off the first chunk's path.

This daemon (:data:`DAEMON_MODULE`, set by ``session_settings`` for ``local[...]`` masters,
see ``spark/session.py``) imports them (:data:`PRELOAD`) before it serves, so each forked
worker inherits them for free: the CPU is paid once per session instead of once per worker
(issue 16: the first chunk soon after the slot exists).

Forking after these imports is safe: the only threads they start are idle helpers that
register fork handlers (OpenBLAS's worker and jemalloc's background thread, Arrow's
allocator); Arrow's thread pools start on first use, which the daemon never makes. A
module that fails to import is left to the worker (which then imports it itself and reports
the error as the task's), so the daemon always serves.

A cluster master keeps pyspark's daemon: its executors may import this project from another
path, or not have it where a task does not need it.
"""

from __future__ import annotations

import importlib
import os

DAEMON_MODULE = "pgcdc_dagster.spark.worker_daemon"
"""What ``spark.python.daemon.module`` names (this package; ``__main__`` runs the daemon)."""

PRELOAD: tuple[str, ...] = ("pgcdc_dagster.spark.snapshot_tasks", "pyspark.worker", "pandas")
"""The modules a snapshot chunk's task runs (with everything they import). ``pandas``:
pyarrow imports it the first time it converts a numpy array (``pa.array``'s pandas check),
which the binary decoder does in every worker's first chunk (0.3 s, more on a busy machine)."""

PRELOADED_IN: int | None = None
"""The PID of the daemon that imported :data:`PRELOAD` (None in a process that did not):
a worker forked from it has it as its parent."""


def preload() -> list[str]:
    """Import :data:`PRELOAD`; the modules that could not be imported (left to workers)."""
    global PRELOADED_IN
    failed = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # the worker imports it again and reports the error as the task's
            failed.append(name)
    PRELOADED_IN = os.getpid()
    return failed
