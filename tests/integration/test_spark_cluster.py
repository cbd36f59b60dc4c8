"""Issue 19 item 4: the capture on a real Spark standalone cluster (two workers, loopback).

The master and two workers are started with pyspark's own launcher; the driver runs in a
child process with ``master=spark://…`` (the test session already holds a local
SparkContext). The snapshot chunk readers and a Spark-prepared silver batch run for a local
lakehouse and for an ``s3://`` one. The workers were started without the project on their
path and without any AWS variable: the executors get the project's Python from the
documented shared-path settings (``spark.pyspark.python``, ``spark.executorEnv.PYTHONPATH``,
see ``spark/session.cluster_conf``) and the storage options inside the tasks. Spark's REST
API then shows the tasks ran on the two workers' executors, not the driver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc_dagster.lake.paths import table_uri
from tests.support import spark_cluster
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    running = spark_cluster.start(workers=2)
    try:
        yield running
    finally:
        running.stop()


def test_snapshot_and_silver_on_a_standalone_cluster(cluster, pg_dsn, pg_conn, lakehouse,
                                                     s3_lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, label text, qty int)")
        cur.execute("INSERT INTO items SELECT g, repeat('x', 40) || g, g "
                    "FROM generate_series(1, 3000) g")
    lakes = [str(lakehouse), s3_lakehouse]
    ui_port = spark_cluster.free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, "-m", "tests.support.spark_cluster", cluster.master,
                           str(ui_port), pg_dsn, *lakes], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])

    for lake in lakes:
        assert_silver_equals_source(pg_conn, table_uri(lake, "silver", "public", "items"),
                                    "public", "items", ["id"])
    assert all(n > 2 for n in result["chunks"])  # the snapshot was split into tasks
    by_id = {e["id"]: e for e in result["executors"]}
    workers = [e for i, e in by_id.items() if i != "driver"]
    assert by_id["driver"]["totalTasks"] == 0
    assert len(workers) == 2 and all(e["totalTasks"] > 0 for e in workers), workers
    snapshot_jobs = [j for j in result["jobs"] if "pgcdc snapshot:" in j["name"]
                     and "Python workers" not in j["name"]]
    assert len(snapshot_jobs) == 2 and all(j["status"] == "SUCCEEDED" for j in snapshot_jobs)
    assert sum(e["totalTasks"] for e in workers) >= sum(result["chunks"])
