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
(issue 16: the first chunk soon after the slot exists). When the process prestarted Spark
for a snapshot, these imports were made meanwhile by a zygote (``zygote.py``), and the
daemon hands its work over to it instead of importing them after the JVM is up.

Forking after these imports is safe: the only threads they start are idle helpers that
register fork handlers (OpenBLAS's worker and jemalloc's background thread, Arrow's
allocator); Arrow's thread pools start on first use, which the daemon never makes. A
module that fails to import is left to the worker (which then imports it itself and reports
the error as the task's), so the daemon always serves.

Spark puts its Python sources first on the daemon's ``PYTHONPATH`` (``pyspark.zip`` and the
py4j zip of its home). Modules imported from a zip are compiled from source every time (no
bytecode is cached for them): ~0.45 CPU s of the daemon's imports. When Spark's home is the
installed ``pyspark`` package (pip's), the same sources are installed, with cached bytecode,
beside it: :func:`installed_over_zips` takes the zips off ``sys.path`` first.

**The preloaded objects are frozen** (``gc.freeze``) before the daemon forks: pyspark's daemon
runs a full ``gc.collect()`` in a worker after every task, and the cyclic collector's full
collections walk every object the worker has, pandas', pyarrow's and pyspark's modules,
classes and functions included, writing to each one's header. In a forked worker each
collection cost tens of milliseconds and the first one copied most of the heap pages it
shares with the daemon (copy-on-write): about 8 % of a worker's CPU during a 5M-row
snapshot, 70-80 ns per row (issue 16; a single process reading the same chunks, without
the per-task collections, did not pay it). Frozen, they are out of the collector's reach:
a collection walks what the worker's tasks created. The collector is paused during the
imports too (as ``pgcdc_dagster.startup`` does for the code location's process).

**Freed memory stays with the worker** (:func:`keep_freed_memory`, before the imports): a
chunk allocates and frees the same large buffers row group after row group (the receive
buffers and the field walk's arrays through glibc's ``malloc``, the Arrow arrays and Parquet
pages through Arrow's pool). By default both hand freed memory back to the kernel soon
(glibc unmaps blocks above its mmap threshold and trims its heaps; mimalloc purges after
10 ms), and the kernel then zeroes every page again on the next touch: 12-17 page faults
per 1,000 rows and about a fifth of a worker's CPU in the kernel (page clearing, fault
entry, memory-cgroup charging) during a 5M-row snapshot. The daemon sets glibc's mmap
threshold to 32 MiB and its trim threshold to 1 GiB (``mallopt``, inherited by the workers
it forks) and ``MIMALLOC_PURGE_DELAY=-1`` (unless set): 0-0.3 faults per 1,000 rows, a
worker's CPU per row 10-20 % lower, for a peak 20-40 MiB higher (260 -> 280-300 MiB per
worker), kept until the worker ends with its session (issue 16). Allocations above 32 MiB
(a row group of huge values) are still mapped and unmapped on their own.

A cluster master keeps pyspark's daemon: its executors may import this project from another
path, or not have it where a task does not need it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

DAEMON_MODULE = "pgcdc_dagster.spark.worker_daemon"
"""What ``spark.python.daemon.module`` names (this package; ``__main__`` runs the daemon)."""

PRELOAD: tuple[str, ...] = ("pgcdc_dagster.spark.snapshot_tasks", "pyspark.worker", "pandas")
"""The modules a snapshot chunk's task runs (with everything they import). ``pandas``:
pyarrow imports it the first time it converts a numpy array (``pa.array``'s pandas check),
which the binary decoder does in every worker's first chunk (0.3 s, more on a busy machine)."""

PRELOADED_IN: int | None = None
"""The PID of the daemon that imported :data:`PRELOAD` (None in a process that did not):
a worker forked from it has it as its parent."""

HANDED_OFF_FROM: int | None = None
"""In a daemon forked by a zygote (``zygote.py``: the imports done while the JVM started),
the zygote's PID; None in a daemon that Spark started and that imported them itself."""


MMAP_THRESHOLD = 32 << 20
"""glibc's largest mmap threshold on 64-bit systems: smaller blocks come from its heaps."""
TRIM_THRESHOLD = 1 << 30
"""Free memory a glibc heap keeps at its top instead of returning it."""
MIMALLOC_PURGE_ENV = "MIMALLOC_PURGE_DELAY"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def keep_freed_memory() -> bool:
    """Have this process (and the workers it forks) reuse the memory it frees instead of
    handing it back to the kernel (module docstring); True when glibc took the settings
    (False elsewhere: another C library, or not Linux). Call before pyarrow is imported:
    mimalloc reads its options when it starts."""
    os.environ.setdefault(MIMALLOC_PURGE_ENV, "-1")
    if sys.platform != "linux":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def preload() -> list[str]:
    """Import :data:`PRELOAD` with the collector paused, then freeze what the process holds
    (the workers it forks inherit it out of the collector's reach); the modules that could
    not be imported (left to workers)."""
    global PRELOADED_IN
    enabled = gc.isenabled()
    gc.disable()
    keep_freed_memory()
    failed = []
    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:  # the worker imports it again, reports the error as the task's
                failed.append(name)
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
    PRELOADED_IN = os.getpid()
    return failed


def _installed_instead(entry: str) -> str | None:
    """The ``site-packages`` directory that holds the package a Spark source zip holds, when
    it is that zip's own installation (``<site>/pyspark/python/lib/pyspark.zip`` or
    ``py4j-*-src.zip`` with ``<site>/pyspark`` and ``<site>/py4j`` installed); else None."""
    lib, name = os.path.split(entry)
    if name == "pyspark.zip":
        package = "pyspark"
    elif name.startswith("py4j-") and name.endswith("-src.zip"):
        package = "py4j"
    else:
        return None
    home = os.path.dirname(os.path.dirname(lib))  # <spark home>/python/lib
    if os.path.basename(home) != "pyspark" or lib != os.path.join(home, "python", "lib"):
        return None
    site = os.path.dirname(home)
    if not os.path.isfile(os.path.join(home, "__init__.py")) or not os.path.isfile(
            os.path.join(site, package, "__init__.py")):
        return None
    return site


def installed_over_zips(path: Sequence[str]) -> list[str]:
    """``path`` (``sys.path``) without Spark's source zips whose packages are installed
    (the ``site-packages`` holding them stays where it is, or takes the zip's place if it is
    not on the path); a zip of another Spark home is kept."""
    out: list[str] = []
    for entry in path:
        site = _installed_instead(entry)
        if site is None:
            out.append(entry)
        elif site not in path and site not in out:
            out.append(site)
    return out


def exit_now(code: int) -> NoReturn:
    """Flush and exit without the interpreter's teardown (pandas, pyarrow and the rest of
    the preloaded modules: tenths of a CPU second while the JVM shuts down): nothing of
    a daemon (or zygote) is left to finalize."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
