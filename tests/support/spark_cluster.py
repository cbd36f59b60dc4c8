"""A real Spark standalone cluster on loopback, started with pyspark's own launcher.

One master and ``workers`` workers (``--cores 1 --memory 1g`` each), every one a process of
this test run (``$SPARK_HOME/bin/spark-class``; pyspark's package directory is SPARK_HOME),
stopped by PID. Also the driver side of the cluster test, run in a child process (one
SparkContext per process, and the test session already has its local one):

    python -m tests.support.spark_cluster MASTER UI_PORT DSN LAKEHOUSE [DSN LAKEHOUSE]...
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
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=120) as response:
        return json.loads(response.read())


@dataclass
class Cluster:
    master: str
    webui: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workdir: Path | None = None

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in get_json(f"{self.webui}/json/")["workers"] if w["state"] == "ALIVE"]

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.terminate()
        for proc in self.processes:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)  # logs and executor work dirs


def start(workers: int = 2, timeout: float = 240.0) -> Cluster:
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    workdir = Path(tempfile.mkdtemp(prefix="pgcdc-spark-cluster-"))
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(workdir), SPARK_NO_DAEMONIZE="1")
    for name in ("PYTHONPATH", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_ENDPOINT_URL"):
        env.pop(name, None)  # executors get the project and credentials from the driver
    port, ui = free_port(), free_port()
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}", workdir=workdir)
    launcher = f"{home}/bin/spark-class"

    def spawn(args: list[str], log: str) -> None:
        with open(workdir / log, "wb") as out:
            cluster.processes.append(subprocess.Popen([launcher, *args], env=env, stdout=out,
                                                      stderr=subprocess.STDOUT))

    try:
        spawn(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
               str(port), "--webui-port", str(ui)], "master.log")
        _wait(lambda: get_json(f"{cluster.webui}/json/")["status"] == "ALIVE", timeout,
              workdir / "master.log")
        for i in range(workers):
            spawn(["org.apache.spark.deploy.worker.Worker", cluster.master, "--host",
                   "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port",
                   str(free_port()), "--work-dir", str(workdir / f"work{i}")], f"worker{i}.log")
        _wait(lambda: len(cluster.alive_workers()) == workers, timeout, workdir / "worker0.log")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait(ready: Any, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except (OSError, ValueError):  # not listening yet, or an empty page while starting
            pass
        time.sleep(0.5)
    raise RuntimeError(f"Spark cluster not ready after {timeout}s: {log.read_text()[-2000:]}")


def _origin(batches: Any) -> Any:
    """``mapInArrow`` function: where the executor's ``pgcdc_dagster`` comes from (defined
    here, in the driver's ``__main__``, so that it travels by value: the executors have
    only the project's package, not its tests)."""
    import pyarrow as pa

    from pgcdc_dagster.spark import chunk_jobs  # the package is a namespace: no __file__

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({
        "package": pa.array([str(chunk_jobs.__file__).rsplit("/pgcdc_dagster/", 1)[0]]),
        "pid": pa.array([os.getpid()], pa.int64())})


def drive(master: str, ui_port: int, runs: list[tuple[str, str]]) -> dict[str, Any]:
    """The end-to-end scenario (:mod:`tests.support.e2e_scenario`) on the cluster, once
    per ``(dsn, lakehouse)``, concurrently, in one application; returns what Spark's REST API
    says about its executors and jobs, and which Python and ``pgcdc_dagster`` they ran."""
    from pgcdc_dagster.spark.session import build_session
    from tests.support import e2e_scenario

    spark = build_session(master, "pgcdc-cluster-test",
                          {"spark.ui.enabled": "true", "spark.ui.port": str(ui_port),
                           "spark.executor.memory": "512m", "spark.executor.cores": "1"})

    # The lakehouses' scenarios run at the same time, as two captures sharing a cluster do
    # (their own databases, slots and lakehouses): the cluster's executors are shared.
    outcomes = e2e_scenario.run_each(spark, runs, "cluster")
    origins = spark.range(0, 64).mapInArrow(_origin, "package string, pid bigint").collect()
    apps = get_json(f"http://127.0.0.1:{ui_port}/api/v1/applications")
    api = f"http://127.0.0.1:{ui_port}/api/v1/applications/{apps[0]['id']}"
    executors = get_json(f"{api}/allexecutors")
    jobs = get_json(f"{api}/jobs")
    spark.stop()
    return {"chunks": [c for c, _, _ in outcomes], "chunk_executors": [e for _, e, _ in outcomes],
            "seconds": [s for _, _, s in outcomes], "driver_pid": os.getpid(),
            "packages": sorted({r["package"] for r in origins}), "executors": [
                {"id": e["id"], "hostPort": e["hostPort"], "totalTasks": e["totalTasks"]}
                for e in executors],
            "jobs": [{"status": j["status"], "tasks": j["numCompletedTasks"]} for j in jobs]}


if __name__ == "__main__":
    master_url, port_text, *pairs = sys.argv[1:]
    print("RESULT " + json.dumps(drive(master_url, int(port_text),
                                       list(zip(pairs[::2], pairs[1::2], strict=True)))))
