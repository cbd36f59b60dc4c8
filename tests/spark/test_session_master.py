"""The session's settings and master: any Spark setting can be given (the ``conf`` mapping,
``PGCDC_SPARK_CONF``), a session of another master already running is not handed back, bad
URLs are refused naming the setting, and the resource stops only what it opened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.spark.session import (
    CONF_ENV,
    env_conf,
    open_session,
    session_settings,
)
from resources import SparkResource

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
from pgcdc_dagster.spark.session import build_session, open_session
early = build_session("local[1]", app_name="early", conf={"spark.ui.enabled": "true"})
assert early.conf.get("spark.sql.session.timeZone") == "UTC"
assert early.conf.get("spark.ui.enabled") == "true"  # the user's setting wins
run = build_session("local[2]", app_name="run")
assert run.conf.get("spark.master") == "local[2]", run.conf.get("spark.master")
again = open_session("local[2]", app_name="run")
assert not again.owned and again.session.conf.get("spark.master") == "local[2]"
again.close()  # not its to stop: the session still works
assert run.range(10).count() == 10
print("ok")
"""


def test_a_session_of_another_master_is_replaced_and_a_running_one_kept() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def test_any_spark_setting_can_be_given(monkeypatch) -> None:
    local = session_settings("local[2]", {"spark.ui.enabled": "true",
                                          "spark.eventLog.enabled": "true"})
    assert local["spark.ui.enabled"] == "true" and local["spark.eventLog.enabled"] == "true"
    assert local["spark.sql.session.timeZone"] == "UTC"
    cluster = session_settings("spark://h:7077", {"spark.driver.host": "10.0.0.5"})
    assert "spark.driver.bindAddress" not in cluster and "spark.ui.enabled" not in cluster
    assert cluster["spark.driver.host"] == "10.0.0.5"
    connect = session_settings("local[2]", {"spark.sql.shuffle.partitions": "8"},
                               remote="sc://h:15002")
    assert connect == {"spark.sql.session.timeZone": "UTC",
                       "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
                       "spark.sql.execution.arrow.pyspark.enabled": "true",
                       "spark.sql.shuffle.partitions": "8"}
    with pytest.raises(ValueError, match="delta-rs"):
        session_settings("local[2]", {"spark.sql.extensions":
                                      "io.delta.sql.DeltaSparkSessionExtension"})
    assert env_conf({CONF_ENV: '{"spark.executor.memory": "2g"}'}) == {
        "spark.executor.memory": "2g"}
    for bad in ("spark.executor.memory=2g", '["x"]'):
        with pytest.raises(ConfigurationError, match=CONF_ENV):
            env_conf({CONF_ENV: bad})
    # The resource: PGCDC_SPARK_CONF under its own conf, PGCDC_SPARK_REMOTE when unset.
    monkeypatch.setenv(CONF_ENV, '{"spark.executor.cores": "1", "spark.ui.port": "4999"}')
    monkeypatch.setenv("PGCDC_SPARK_REMOTE", "sc://spark.example:15002")
    resource = SparkResource(conf={"spark.ui.port": "4050"})
    assert resource.effective_remote() == "sc://spark.example:15002"
    assert SparkResource(remote="sc://other:1").effective_remote() == "sc://other:1"
    handle = resource.lazy()
    assert not handle.created  # nothing connects before the run has Spark work


def test_bad_urls_are_refused_before_spark_starts_naming_the_setting() -> None:
    with pytest.raises(ConfigurationError, match=r"'bogus://nowhere:1'.*PGCDC_SPARK_MASTER"):
        open_session("bogus://nowhere:1")
    with pytest.raises(ConfigurationError, match=r"PGCDC_SPARK_REMOTE.*sc://host:15002"):
        open_session(remote="http://nowhere:15002")
    handle = SparkResource(master="bogus://nowhere:2").lazy()
    handle.start()  # a build in the background reports the same error to the run
    with pytest.raises(ConfigurationError, match=r"PGCDC_SPARK_MASTER.*local\[N\]"):
        handle.get()
