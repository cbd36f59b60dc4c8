"""The capture on a real Spark Connect server (pyspark's own jars, ``local[2]``, loopback).

The server is started once per test session from the installed pyspark
(``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``), without
the project on its path. The driver runs in a child process through the ``spark`` resource
with ``remote=sc://…``: the end-to-end scenario (:mod:`tests.support.e2e_scenario`: snapshot
chunks read by DataFrame work, micro-batches with every kind of change and a TRUNCATE, a
Spark-prepared silver batch, a run SIGKILLed after its bronze commit and its rerun, an
incremental snapshot, silver equal to the source, bronze exact) runs twice at the same time,
into a local and an ``s3://`` lakehouse. The executors import the project from the session's
artifact, the chunks' result rows name the server's Python workers (not the driver), Spark's
REST API shows the tasks, and the resource's teardown releases the session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]


def test_end_to_end_on_a_spark_connect_server(spark_connect_server, pg_dsn, second_pg_dsn,
                                              lakehouse, s3_lakehouse) -> None:
    runs = [(pg_dsn, str(lakehouse)), (second_pg_dsn, s3_lakehouse)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, "-m", "tests.support.spark_connect",
                           spark_connect_server.remote, spark_connect_server.webui,
                           *[arg for run in runs for arg in run]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    print("seconds per step (local, s3):", result["seconds"])

    # The server's executors imported the client's package from the session's artifact.
    assert result["packages"] and all(p.endswith("pgcdc_dagster.zip")
                                      for p in result["packages"]), result["packages"]
    assert all(n > 2 for n in result["chunks"])  # each snapshot was split into tasks
    # The chunks' result rows name the server's Python workers, not the client process.
    pids = {int(e.rsplit(":", 1)[1]) for run in result["executors"] for e in run}
    assert pids and result["driver_pid"] not in pids
    tasks = sum(e["totalTasks"] for e in result["server_executors"])
    assert tasks >= sum(result["chunks"]), result["server_executors"]
    assert result["jobs"] and all(j["status"] == "SUCCEEDED" for j in result["jobs"])
    assert result["released"]  # the resource's teardown closed the session it opened
