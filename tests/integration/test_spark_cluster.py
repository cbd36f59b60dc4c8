"""The capture on a real Spark standalone cluster (two workers, loopback).

The master and two workers are started with pyspark's own launcher; the driver runs in a
child process with ``master=spark://…`` (the test session already holds a local
SparkContext). In that one application, the end-to-end scenario
(:mod:`tests.support.e2e_scenario`: snapshot, micro-batches with every kind of change and a
TRUNCATE, a run SIGKILLed after its bronze commit and its rerun, an incremental snapshot,
silver equal to the source, tables read back by delta-rs, Polars and DuckDB) runs twice at
the same time: into a local lakehouse and into an ``s3://`` one, with the snapshot chunk
readers and a Spark-prepared silver batch on the executors. The workers were started
without the project on their path and without any AWS variable: the executors run the
driver's interpreter (``spark.pyspark.python``) and import the project from the package
archive the session adds as an artifact (``spark/session.package_archive``), which the
executors' own report confirms, and get the storage options inside the tasks. Spark's REST
API and the chunks' result rows then show the tasks ran on the two workers' executors, not
the driver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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

    # The executors imported the driver's package from the session's artifact (the zip
    # ``open_session`` adds), not from the workers' environment (no PYTHONPATH there).
    assert result["packages"] and all(p.endswith("pgcdc_dagster.zip")
                                      for p in result["packages"]), result["packages"]
    assert all(n > 2 for n in result["chunks"])  # each snapshot was split into tasks
    # The chunks' result rows name the Python workers that read them: not the driver.
    pids = {int(e.rsplit(":", 1)[1]) for run in result["chunk_executors"] for e in run}
    assert pids and result["driver_pid"] not in pids
    by_id = {e["id"]: e for e in result["executors"]}
    workers = [e for i, e in by_id.items() if i != "driver"]
    assert by_id["driver"]["totalTasks"] == 0
    assert len(workers) == 2 and all(e["totalTasks"] > 0 for e in workers), workers
    assert all(j["status"] == "SUCCEEDED" for j in result["jobs"]), result["jobs"]
    assert sum(e["totalTasks"] for e in workers) >= sum(result["chunks"])
