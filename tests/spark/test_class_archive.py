"""The Spark driver's class archive (``spark/class_archive.py``): written once, then mapped.

``python -m pgcdc_dagster.spark.class_archive`` writes the archive of this Java and these
Spark jars; a session this project builds afterwards maps it: the JVM's own class-loading log
shows Spark's classes coming from the archive (the dynamic "top" layer), not from the jars.
Without an archive no option is added; the user's Java options come after the project's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc_dagster.spark.class_archive import ARCHIVE_DIR_ENV, archive_path, java_options
from pgcdc_dagster.spark.gateway import spark_home
from pgcdc_dagster.spark.session import QUICK_START_JAVA_OPTIONS, session_settings

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]

_SESSION = """
import sys
from pgcdc_dagster.spark.session import build_session
spark = build_session(app_name="archive-check", conf={
    "spark.driver.extraJavaOptions": "-Xlog:class+load=info:file=" + sys.argv[1]})
assert spark.sparkContext.parallelize(range(4), 2).map(lambda x: x * 2).sum() == 12
"""


def _env(directory: Path) -> dict[str, str]:
    return {**os.environ, ARCHIVE_DIR_ENV: str(directory), "PYTHONPATH": str(ROOT),
            "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}


def test_no_archive_no_option_and_the_users_options_last(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(ARCHIVE_DIR_ENV, str(tmp_path))
    assert archive_path().parent == tmp_path and archive_path().suffix == ".jsa"
    assert java_options() == ""
    archive_path().write_bytes(b"x")  # only looked for here; no JVM maps this one
    assert java_options() == f"-XX:SharedArchiveFile={archive_path()}"
    options = session_settings("local[2]", {"spark.driver.extraJavaOptions": "-Dmine=1"},
                               quick_start=True, java_options=java_options())
    assert options["spark.driver.extraJavaOptions"] == \
        f"{QUICK_START_JAVA_OPTIONS} -XX:SharedArchiveFile={archive_path()} -Dmine=1"


def test_another_spark_installation_gets_its_own_archive(tmp_path, monkeypatch) -> None:
    """The JVM maps an archive only with the class path it was written with: a second venv
    (same Java, same Spark version, jars elsewhere) must not pick the first one's."""
    monkeypatch.setenv(ARCHIVE_DIR_ENV, str(tmp_path))
    here = archive_path()
    copy = tmp_path / "other_spark"
    (copy / "jars").mkdir(parents=True)
    real = Path(spark_home()) / "jars"
    for jar in sorted(real.iterdir())[:3]:
        (copy / "jars" / jar.name).write_bytes(b"")
    monkeypatch.setenv("SPARK_HOME", str(copy))  # pyspark's rule: SPARK_HOME wins
    elsewhere = archive_path()
    assert elsewhere != here
    os.utime(copy / "jars" / sorted(real.iterdir())[0].name, ns=(1, 1))
    assert archive_path() != elsewhere  # a jar changed in place: a new archive


def test_the_archive_is_written_once_then_spark_classes_come_from_it(tmp_path) -> None:
    archives = tmp_path / "archives"
    written = subprocess.run([sys.executable, "-m", "pgcdc_dagster.spark.class_archive"],
                             env=_env(archives), cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
    assert written.returncode == 0, written.stdout[-3000:] + written.stderr[-3000:]
    jsa = [p.name for p in archives.iterdir()]
    assert len(jsa) == 1 and jsa[0].startswith("spark-driver-") and jsa[0].endswith(".jsa")
    assert "class archive written" in written.stdout

    loads = tmp_path / "class-load.log"
    run = subprocess.run([sys.executable, "-c", _SESSION, str(loads)], env=_env(archives),
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    context = [line for line in loads.read_text().splitlines()
               if " org.apache.spark.SparkContext " in line]
    assert context and "shared objects file (top)" in context[0], context
