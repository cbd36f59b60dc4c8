"""A session of another master already running in the JVM is not handed back for this one.

The code location may start Spark before the run from ``PGCDC_SPARK_MASTER``
(``spark/prestart.py``); a run whose resource names another master must get a session of
that master, not the early one (``getOrCreate`` alone returns whatever session is active).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
from pgcdc_dagster.spark.session import build_session
early = build_session("local[1]", app_name="early")
assert early.sparkContext.master == "local[1]"
run = build_session("local[2]", app_name="run")
assert run.sparkContext.master == "local[2]", run.sparkContext.master
assert run.sparkContext.defaultParallelism == 2
assert run.sparkContext.parallelize(range(10), 2).sum() == 45
same = build_session("local[2]", app_name="run")
assert same is run or same.sparkContext is run.sparkContext  # the same master: reused
print("ok")
"""


def test_a_session_of_another_master_is_replaced() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
