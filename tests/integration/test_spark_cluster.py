"""Issue 19 item 3: the capture on a real Spark standalone cluster (two workers, loopback).

The master and two workers are started with pyspark's own launcher; the driver runs in a
child process with ``master=spark://…`` (the test session already holds a local
SparkContext). In that one application, issue 19's end-to-end scenario
(:mod:`tests.support.e2e_scenario`: snapshot, micro-batches with every kind of change and a
TRUNCATE, a run SIGKILLed after its bronze commit and its rerun, an incremental snapshot,
silver equal to the source, tables read back by delta-rs, Polars and DuckDB) runs twice at
the same time: into a local lakehouse and into an ``s3://`` one, with the snapshot chunk
readers and a Spark-prepared silver batch on the executors. The workers were started
without the project on their path and without any AWS variable: the executors get the
project's Python from the documented shared-path settings (``spark.pyspark.python``,
``spark.executorEnv.PYTHONPATH``, see ``spark/session.cluster_conf``), which the executors'
own report confirms, and the storage options inside the tasks. Spark's REST API then shows
the tasks ran on the two workers' executors, not the driver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc_dagster.spark.session import PROJECT_ROOT
from tests.support import spark_cluster

pytestmark = [pytest.mark.integration, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    running = spark_cluster.start(workers=2)
    try:
        yield running
    finally:
        running.stop()


def test_end_to_end_on_a_standalone_cluster(cluster, pg_dsn, second_pg_dsn, lakehouse,
                                            s3_lakehouse) -> None:
    runs = [(pg_dsn, str(lakehouse)), (second_pg_dsn, s3_lakehouse)]
    ui_port = spark_cluster.free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, "-m", "tests.support.spark_cluster", cluster.master,
                           str(ui_port), *[arg for run in runs for arg in run]], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    print("seconds per step (local, s3):", result["seconds"])

    # The executors ran the driver's interpreter and this checkout's package (the workers'
    # environment has neither on its path; the venv's installed copy would be another one).
    assert result["pythons"] == [[sys.executable, PROJECT_ROOT]]
    assert all(n > 2 for n in result["chunks"])  # each snapshot was split into tasks
    by_id = {e["id"]: e for e in result["executors"]}
    workers = [e for i, e in by_id.items() if i != "driver"]
    assert by_id["driver"]["totalTasks"] == 0
    assert len(workers) == 2 and all(e["totalTasks"] > 0 for e in workers), workers
    snapshot_jobs = [j for j in result["jobs"] if "pgcdc snapshot:" in j["name"]
                     and "Python workers" not in j["name"]]
    assert len(snapshot_jobs) == 2 and all(j["status"] == "SUCCEEDED" for j in snapshot_jobs)
    assert sum(e["totalTasks"] for e in workers) >= sum(result["chunks"])
