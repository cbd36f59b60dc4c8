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
from pgcdc_dagster.spark.session import build_context, build_session
context = build_context("local[1]", app_name="early", quick_start=True)  # a snapshot's start
early = build_session("local[1]", app_name="early")  # the SQL session, later, on it
assert early.sparkContext is context
assert early.conf.get("spark.sql.session.timeZone") == "UTC"  # the settings are the session's
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


def test_a_bogus_master_is_refused_before_a_jvm_starts_naming_the_setting() -> None:
    """QA: PGCDC_SPARK_MASTER=bogus://... made initial_snapshot fail with PySpark's bare
    ``JAVA_GATEWAY_EXITED``; the error now names the setting and the accepted forms, also
    when the session is built in the background (the prestart of an initial_snapshot)."""
    from pgcdc_dagster.exceptions import ConfigurationError
    from pgcdc_dagster.spark.prestart import prestart
    from pgcdc_dagster.spark.session import build_session, check_master

    for good in ("local", "local[2]", "local[*]", "spark://h:7077", "k8s://https://h:6443",
                 "yarn"):
        check_master(good)
    with pytest.raises(ConfigurationError, match=r"'bogus://nowhere:1'.*PGCDC_SPARK_MASTER"):
        build_session("bogus://nowhere:1")
    handle = prestart("bogus://nowhere:2", app_name="qa-bogus-master")
    with pytest.raises(ConfigurationError, match=r"PGCDC_SPARK_MASTER.*local\[N\]"):
        handle.get()
