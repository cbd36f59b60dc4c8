"""The driver JVM is launched before pyspark is imported (``spark/gateway.py``, issue 16).

A fresh process's ``build_context`` starts the JVM first, then imports pyspark while the JVM
starts, and creates the context on that JVM: the context is the one of the settings asked
for, runs Python tasks, and its gateway's process is the JVM started first (Spark's stop and
a one-run process's release reach it). A context that exists already (another thread's) is
used and the JVM started meanwhile is ended; a JVM that cannot start is reported as pyspark
reports it. Each scenario is a process of its own (a JVM is one per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.processes import MARK, left_behind

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]

_DRIVER = r'''
import json, os, sys
from pgcdc_dagster.spark import gateway, session

seen = []
spawn = gateway.spawn

def watched(settings):
    settings = list(settings)
    launch = spawn(settings)
    seen.append({"pyspark_imported": "pyspark" in sys.modules, "pid": launch.process.pid,
                 "settings": dict(settings)})
    return launch

gateway.spawn = watched
if sys.argv[1] == "other-first":  # a context exists already: pyspark's own launch
    launch = gateway.spawn([("spark.master", "local[1]"), ("spark.app.name", "early")])
    from pyspark import SparkConf, SparkContext
    first = SparkContext.getOrCreate(SparkConf().setMaster("local[1]").setAppName("other"))
    sc = launch.context(SparkConf().setMaster("local[1]").setAppName("early"))
    print(json.dumps({"same": sc is first, "app": sc.appName,
                      "early_exit": launch.process.wait(timeout=60),
                      "early_dir_left": os.path.exists(launch.directory)}))
    sys.exit(0)
if sys.argv[1] == "session":  # a full SQL session: the same early JVM under it
    spark = session.build_session("local[2]", app_name="gateway-session",
                                  conf={"spark.pgcdc.check": "yes"})
    assert spark.range(5).count() == 5
    print(json.dumps({"spawned": seen, "jvm": spark.sparkContext._gateway.proc.pid,
                      "conf": dict(spark.sparkContext.getConf().getAll()),
                      "time_zone": spark.conf.get("spark.sql.session.timeZone")}))
    sys.exit(0)
sc = session.build_context("local[2]", app_name="gateway-check", quick_start=True,
                           conf={"spark.pgcdc.check": "yes"})
assert sc.parallelize(range(4), 2).map(lambda x: x * 3).collect() == [0, 3, 6, 9]
jvm = sc._gateway.proc.pid
status = open(f"/proc/{jvm}/status").read().splitlines()
ignored = int(next(line for line in status if line.startswith("SigIgn:")).split()[1], 16)
exe = os.path.basename(os.readlink(f"/proc/{jvm}/exe"))
print(json.dumps({"spawned": seen, "jvm": sc._gateway.proc.pid, "exe": exe,
                  "sigint_ignored": bool(ignored & (1 << 1)),
                  "conf": dict(sc.getConf().getAll()), "pin": type(sc._gateway).__name__}))
'''


def _driver(scenario: str, **env: str) -> tuple[dict[str, object], str]:
    mark = uuid.uuid4().hex
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, scenario], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env={**os.environ, MARK: mark, "PYTHONPATH": str(ROOT),
                          "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
                          **env})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout[-3000:]
    return json.loads(lines[0]), mark


def test_the_jvm_starts_before_pyspark_is_imported_and_serves_the_context() -> None:
    report, mark = _driver("fresh")
    spawned = report["spawned"]
    assert isinstance(spawned, list) and len(spawned) == 1, report
    # Launched first: pyspark (and pandas, through py4j's converters) imported meanwhile.
    assert spawned[0]["pyspark_imported"] is False
    # The context is on that JVM, with the settings it was asked for.
    assert report["jvm"] == spawned[0]["pid"]
    conf = report["conf"]
    assert isinstance(conf, dict)
    assert conf["spark.app.name"] == "gateway-check" and conf["spark.master"] == "local[2]"
    assert conf["spark.pgcdc.check"] == "yes"
    assert spawned[0]["settings"]["spark.pgcdc.check"] == "yes"
    assert report["pin"] == "ClientServer"  # pyspark's default (PYSPARK_PIN_THREAD)
    # The process started is the JVM itself (the scripts exec it) and ignores Ctrl-C, as
    # pyspark's launch makes it: the driver handles it and stops Spark.
    assert report["exe"] == "java" and report["sigint_ignored"] is True
    assert left_behind(mark) == []  # the JVM ends with its driver, as pyspark's does


def test_a_sql_session_is_built_on_the_jvm_started_first() -> None:
    report, mark = _driver("session")
    spawned = report["spawned"]
    assert isinstance(spawned, list) and len(spawned) == 1, report
    assert spawned[0]["pyspark_imported"] is False and report["jvm"] == spawned[0]["pid"]
    conf = report["conf"]
    assert isinstance(conf, dict)
    assert conf["spark.app.name"] == "gateway-session" and conf["spark.pgcdc.check"] == "yes"
    assert report["time_zone"] == "UTC"  # the project's SQL settings hold in the session
    assert left_behind(mark) == []


def test_a_context_that_exists_is_used_and_the_early_jvm_ended() -> None:
    report, mark = _driver("other-first")
    assert report == {"same": True, "app": "other", "early_exit": -9,  # killed
                      "early_dir_left": False}
    assert left_behind(mark) == []


def test_a_jvm_that_cannot_start_is_reported_as_pyspark_reports_it(tmp_path,
                                                                    monkeypatch) -> None:
    from pyspark.errors import PySparkRuntimeError

    from pgcdc_dagster.spark import gateway

    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    launch = gateway.spawn([("spark.master", "local[1]"), ("spark.app.name", "x")])
    with pytest.raises(PySparkRuntimeError, match="JAVA_GATEWAY_EXITED"):
        launch.connect()
    assert launch.process.poll() is not None
    assert not Path(launch.directory).exists()
