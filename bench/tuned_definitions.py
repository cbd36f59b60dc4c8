"""The code location with the process tuning a deployment may opt into (``bench_scale.py
--tuned``): the definitions, then ``tune_process()`` (Arrow on jemalloc, imports frozen out
of the collector). A deployment's own module does the same."""

from pgcdc_dagster.definitions import defs
from pgcdc_dagster.tuning import tune_process

tune_process()

__all__ = ["defs"]
