"""Process-level tuning a deployment may opt into: nothing of it happens on import.

Importing any module of ``pgcdc_dagster`` leaves the process as it was (garbage collector,
environment, warning filters, threads, child processes). A deployment that wants the
settings the benchmarks in ``docs/bench/`` ran with calls :func:`tune_process` itself, in its
own code location module, after its imports::

    from pgcdc_dagster.definitions import defs  # noqa: F401
    from pgcdc_dagster.tuning import tune_process

    tune_process()
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass

ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


@dataclass(frozen=True)
class Tuned:
    """What :func:`tune_process` changed."""

    arrow_pool: str | None
    """The Arrow pool pyarrow's Python API now allocates from (None: left as it was)."""
    arrow_env_set: bool
    """``ARROW_DEFAULT_MEMORY_POOL`` set to jemalloc (pyarrow not loaded yet, variable unset)."""
    frozen: int
    """Objects moved out of the garbage collector's reach (``gc.freeze``)."""


def tune_process(*, arrow_pool: bool = True, freeze: bool = True) -> Tuned:
    """Tune this process for capture runs, on the deployment's explicit request.

    * ``arrow_pool``: Arrow allocates with jemalloc and returns freed pages at once (the
      default mimalloc kept tens of MiB after a 200k-change micro-batch). Arrow's C++
      allocations (Parquet readers and writers) follow only ``ARROW_DEFAULT_MEMORY_POOL``,
      read when pyarrow loads: it is set here when pyarrow is not loaded yet and the
      variable is unset; otherwise set it in the deployment's environment.
    * ``freeze``: the objects alive now (modules, classes, functions: Dagster's, pyarrow's
      and this package's) are frozen out of the collector's reach, so the collections of a
      run walk only what the run creates. Call it after the imports.
    """
    env_set = False
    pool_name = None
    if arrow_pool:
        if "pyarrow" not in sys.modules and ARROW_POOL_ENV not in os.environ \
                and sys.platform == "linux":
            os.environ[ARROW_POOL_ENV] = "jemalloc"  # PyPI's Linux wheels have it
            env_set = True
        from pgcdc_dagster.lake.memory import use_returning_pool

        if use_returning_pool():
            pool_name = "jemalloc"
    frozen = 0
    if freeze:
        before = gc.get_freeze_count()
        gc.freeze()
        frozen = gc.get_freeze_count() - before
    return Tuned(arrow_pool=pool_name, arrow_env_set=env_set, frozen=frozen)
