"""What the code location's process sets before its imports (issue 16: start-up and memory).

``pgcdc_dagster.definitions`` imports this module before anything else and calls
:func:`settle` at its end. Meanwhile:

* **The cyclic garbage collector is paused.** A ``dagster job execute`` process holds ~200k
  objects by then (Dagster's, pyarrow's, deltalake's and this package's modules, classes and
  functions, alive until the process ends): each full collection while they are created walks
  all of them again (tenths of a second under load). :func:`settle` moves them out of the
  collector's reach (``gc.freeze``), so the collections of a run walk only what the run
  creates. Only garbage cycles left by the imports themselves (a few at most) are never
  freed. If the import fails, the process reports the load error and runs nothing; the
  collector stays paused in it.
* **Arrow allocates with jemalloc** (``ARROW_DEFAULT_MEMORY_POOL=jemalloc``, on Linux, unless
  the variable is set already), read when pyarrow first allocates. ``pyarrow.set_memory_pool``
  (``lake/memory.py``) changes only the pool pyarrow's Python API passes; Arrow's own
  allocations (Parquet writers and readers, compute kernels) stay on the built-in default,
  mimalloc, whose arena kept ~40–60 MiB after a 200k-change micro-batch (it returns pages
  lazily): the run's peak RSS was 50–65 MiB higher with it.
"""

from __future__ import annotations

import gc
import os
import sys

_WAS_ENABLED = gc.isenabled()
gc.disable()

ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"
if sys.platform == "linux" and "pyarrow" not in sys.modules:
    os.environ.setdefault(ARROW_POOL_ENV, "jemalloc")  # PyPI's Linux wheels have it


def settle() -> None:
    """Freeze what the imports created and resume the collector as it was (idempotent)."""
    gc.freeze()
    if _WAS_ENABLED:
        gc.enable()
