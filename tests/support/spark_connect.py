"""A real Spark Connect server on loopback, started from pyspark's own jars.

``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` with a
``local[2]`` master, its UI on a free port (Spark's REST API shows where tasks ran), its
Python workers on this venv's interpreter, and no ``PYTHONPATH``: the executors get this
checkout's ``pgcdc_dagster`` only as the session's artifact (``SparkSession.addArtifacts``).
Stopped by PID. Also the driver side of the Connect test, run in a child process (a Spark
Connect client turns the process's pyspark functions to Connect mode, and the test session
holds a classic local session):

    python -m tests.support.spark_connect REMOTE UI_URL DSN LAKEHOUSE [DSN LAKEHOUSE]...
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.support.spark_cluster import free_port, get_json

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass
class ConnectServer:
    remote: str
    webui: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start(timeout: float = 300.0) -> ConnectServer:
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    workdir = Path(tempfile.mkdtemp(prefix="pgcdc-spark-connect-"))
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable)
    for name in ("PYTHONPATH", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_ENDPOINT_URL", "SPARK_REMOTE"):
        env.pop(name, None)  # the project and credentials come from the client
    port, ui = free_port(), free_port()
    log = workdir / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [f"{home}/bin/spark-submit", "--class", SERVER_CLASS, "--master", "local[2]",
             "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", "spark.ui.enabled=true", "--conf", f"spark.ui.port={ui}",
             "--conf", f"spark.local.dir={workdir}", "--conf", "spark.log.level=WARN",
             "spark-internal"], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    server = ConnectServer(f"sc://127.0.0.1:{port}", f"http://127.0.0.1:{ui}", process,
                           workdir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return server
        except OSError:
            time.sleep(0.5)
    text = log.read_text()[-3000:]
    server.stop()
    raise RuntimeError(f"Spark Connect server not ready after {timeout}s: {text}")


def _origin(batches: Any) -> Any:
    """``mapInArrow`` function: where the executor's ``pgcdc_dagster`` comes from (defined
    in the driver's ``__main__``, so that it travels by value: the server has only the
    project's package, not its tests)."""
    from pgcdc_dagster.spark import chunk_jobs  # the package is a namespace: no __file__

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({
        "package": pa.array([str(chunk_jobs.__file__).rsplit("/pgcdc_dagster/", 1)[0]]),
        "pid": pa.array([os.getpid()], pa.int64())})


def drive(remote: str, webui: str, runs: list[tuple[str, str]]) -> dict[str, Any]:
    """The end-to-end scenario (:mod:`tests.support.e2e_scenario`) through the ``spark``
    resource on the Spark Connect server, once per ``(dsn, lakehouse)``, concurrently;
    returns the chunks' executors, where the executors' package came from, what Spark's REST
    API says about the server's jobs, and the session's state after the resource's
    teardown."""
    from pgcdc_dagster.resources import SparkResource
    from tests.support import e2e_scenario

    resource = SparkResource(remote=remote, app_name="pgcdc-connect-test")
    handle = resource.lazy()
    assert not handle.created
    outcomes = e2e_scenario.run_each(handle, runs, "connect")
    session = handle.get()
    origins = session.range(0, 64).mapInArrow(_origin, "package string, pid bigint").collect()
    apps = get_json(f"{webui}/api/v1/applications")
    jobs = get_json(f"{webui}/api/v1/applications/{apps[0]['id']}/jobs")
    executors = get_json(f"{webui}/api/v1/applications/{apps[0]['id']}/allexecutors")
    resource.teardown_after_execution(None)  # type: ignore[arg-type]
    try:
        session.range(1).count()
        released = False
    except Exception:  # the client was closed: the session is released on the server
        released = True
    return {"chunks": [c for c, _, _ in outcomes], "executors": [e for _, e, _ in outcomes],
            "seconds": [s for _, _, s in outcomes], "driver_pid": os.getpid(),
            "packages": sorted({r["package"] for r in origins}),
            "worker_pids": sorted({r["pid"] for r in origins}),
            "jobs": [{"status": j["status"], "tasks": j["numCompletedTasks"],
                      "tags": j.get("jobTags", [])} for j in jobs],
            "server_executors": [{"id": e["id"], "totalTasks": e["totalTasks"]}
                                 for e in executors],
            "released": released}


if __name__ == "__main__":
    remote_url, ui_url, *pairs = sys.argv[1:]
    print("RESULT " + json.dumps(drive(remote_url, ui_url,
                                       list(zip(pairs[::2], pairs[1::2], strict=True)))))
