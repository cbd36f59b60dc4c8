"""A one-run process ends its Spark JVM once the run's Spark work is over, at the latest at
exit (``spark/release.py``, issue 16): the JVM is gone when the process is, its scratch
directory with it, and nothing it started is left.
Other processes keep the session as before: no scratch directory of ours, the user's
``spark.local.dir`` respected.

Each scenario is a driver process of its own (its own JVM), marked by an environment variable
every process it starts inherits, with its output in a file (a pipe would be held open by
the JVM), so the test sees the moment the driver ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from pgcdc_dagster.spark import release
from tests.support.processes import MARK, left_behind

DRIVER = r'''
import json, os, sys, tempfile, time
from pgcdc_dagster.spark import release
from pgcdc_dagster.spark.prestart import prestart

if sys.argv[1].startswith("one-run"):
    release.enable()
handle = prestart("local[2]")
sc = handle.tasks().sparkContext
assert sc.parallelize(range(4), 2).map(lambda x: x * 2).collect() == [0, 2, 4, 6]
conf = dict(sc.getConf().getAll())
report = {"jvm": sc._gateway.proc.pid, "local_dir": conf.get("spark.local.dir"),
          "java": conf.get("spark.driver.extraJavaOptions", "")}
if sys.argv[1] == "one-run":  # the run's Spark work is over: ended before the process exits
    release.spark_work_done()
    proc = sc._gateway.proc
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    report["ended_before_exit"] = proc.poll() is not None
print(json.dumps(report), flush=True)
'''


def _run(mode: str, tmp_path: Path) -> tuple[dict[str, object], str, Path]:
    """Run a driver to its end; its report, its mark and its TMPDIR."""
    mark = uuid.uuid4().hex
    # Too long for the worker zygote's socket path: the prestart goes on without it.
    tmp = tmp_path / f"{mode}-{'t' * 100}"
    tmp.mkdir()
    env = {**os.environ, MARK: mark, "TMPDIR": str(tmp), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable}
    out = tmp_path / f"{mode}.out"
    with out.open("w") as sink:
        proc = subprocess.run([sys.executable, "-c", DRIVER, mode], env=env, stdout=sink,
                              stderr=subprocess.STDOUT, timeout=300)
    report = _report(out)
    report["jvm_alive_at_exit"] = _alive(report["jvm"])  # checked as soon as the driver ended
    assert proc.returncode == 0, out.read_text()[-3000:]
    return report, mark, tmp


def _report(out: Path) -> dict[str, object]:
    lines = [line for line in out.read_text().splitlines() if line.startswith("{")]
    assert len(lines) == 1, out.read_text()[-3000:]
    return json.loads(lines[0])  # type: ignore[no-any-return]


def _alive(pid: object) -> bool:
    assert isinstance(pid, int)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["one-run", "one-run-at-exit"])
def test_a_one_run_process_ends_its_jvm_and_scratch_with_it(mode, tmp_path) -> None:
    report, mark, tmp = _run(mode, tmp_path)
    # The JVM had a scratch directory of the process's own, under TMPDIR ...
    local_dir = report["local_dir"]
    assert isinstance(local_dir, str)
    assert Path(local_dir).parent == tmp
    assert Path(local_dir).name.startswith(release.SCRATCH_PREFIX)
    assert f"-Djava.io.tmpdir={local_dir}" in str(report["java"])
    # ... and it was gone, the JVM with it, when the driver's process ended: a JVM left to
    # end by itself is still running then (it notices its input closed, then runs its hooks).
    assert report["jvm_alive_at_exit"] is False
    # Once the run's Spark work was done, on a thread; else by the exit handler.
    assert report.get("ended_before_exit") is (True if mode == "one-run" else None)
    assert list(tmp.iterdir()) == []
    assert left_behind(mark) == []  # the daemon, the zygote, the workers


@pytest.mark.spark
def test_other_processes_keep_the_jvms_own_exit(tmp_path) -> None:
    report, mark, _tmp = _run("shared", tmp_path)
    assert report["local_dir"] is None  # Spark's default, as before
    assert "java.io.tmpdir" not in str(report["java"])
    assert left_behind(mark) == []


def test_scratch_only_for_a_one_run_local_jvm_the_user_left_alone(monkeypatch,
                                                                  tmp_path) -> None:
    monkeypatch.setattr(release, "_STATE", release._Release())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    assert release.scratch_settings("local[2]", None) == ({}, "")  # not a one-run process
    monkeypatch.setattr(release._STATE, "enabled", True)  # as enable() does, without atexit
    assert release.scratch_settings("spark://host:7077", None) == ({}, "")
    assert release.scratch_settings("local[2]", {"spark.local.dir": "/data"}) == ({}, "")
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/data")
    assert release.scratch_settings("local[2]", None) == ({}, "")
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    settings, options = release.scratch_settings("local[*]", {})
    scratch = Path(settings["spark.local.dir"])
    assert scratch.parent == tmp_path and scratch.is_dir()
    assert options == f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData"
    assert release.scratch_settings("local[2]", {})[0] == settings  # one per process
    release.remove_scratch()
    assert not scratch.exists()
