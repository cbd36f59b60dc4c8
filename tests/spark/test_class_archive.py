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
    jsa = sorted(p.name for p in archives.iterdir())  # the driver's, then the launcher's
    assert len(jsa) == 2 and all(name.endswith(".jsa") for name in jsa), jsa
    assert jsa[0].startswith("spark-driver-") and jsa[1].startswith("spark-launcher-")
    assert jsa[0].split("-")[-1] == jsa[1].split("-")[-1]  # the same Java and jars
    assert "driver class archive written" in written.stdout
    assert "launcher class archive written" in written.stdout

    loads = tmp_path / "class-load.log"
    run = subprocess.run([sys.executable, "-c", _SESSION, str(loads)], env=_env(archives),
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    context = [line for line in loads.read_text().splitlines()
               if " org.apache.spark.SparkContext " in line]
    assert context and "shared objects file (top)" in context[0], context


def test_the_launcher_maps_its_own_archive_and_prints_only_the_command(tmp_path,
                                                                      monkeypatch) -> None:
    """Spark's launcher JVM (spark-class's, before every driver) maps its small archive once
    written, and its log lines never reach the standard output spark-class reads."""
    from pgcdc_dagster.spark import class_archive
    from pgcdc_dagster.spark.session import LAUNCHER_JAVA_OPTIONS, launcher_java_options

    monkeypatch.setenv(ARCHIVE_DIR_ENV, str(tmp_path))
    assert class_archive.launcher_options() == ""
    assert launcher_java_options() == LAUNCHER_JAVA_OPTIONS
    written = class_archive.write_launcher_archive()
    assert written == class_archive.launcher_archive_path() and written.stat().st_size > 0
    assert list(tmp_path.iterdir()) == [written]  # no partial file left
    options = launcher_java_options()
    assert options == f"{LAUNCHER_JAVA_OPTIONS} -XX:SharedArchiveFile={written} " \
                      f"{class_archive.LAUNCHER_LOGGING}"
    loads = tmp_path / "launcher-loads.log"
    launched = class_archive._launch(f"-XX:SharedArchiveFile={written} "
                                     f"-Xlog:class+load=info:file={loads}")
    assert launched.returncode == 0, launched.stderr[-3000:]
    main_class = [line for line in loads.read_text().splitlines()
                  if " org.apache.spark.launcher.Main " in line]
    assert main_class and "shared objects file" in main_class[0], main_class
    # An archive the launcher cannot map (another class path): the warning goes to standard
    # error, the launcher still prints its command (here: spark-class runs the driver).
    other = tmp_path / "other.jsa"
    launcher_jar = next((Path(spark_home()) / "jars").glob("spark-launcher_*.jar"))
    subprocess.run([class_archive._java(), f"-XX:ArchiveClassesAtExit={other}", "-Xlog:disable",
                    "-cp", str(launcher_jar), "org.apache.spark.launcher.Main"],
                   capture_output=True, timeout=120)  # its usage error; the archive written
    assert other.is_file()
    broken = class_archive._launch(f"-XX:SharedArchiveFile={other}")
    assert broken.returncode == 0, broken.stderr[-3000:]
    assert "Unable to use shared archive" in broken.stderr, broken.stderr[-3000:]
    assert "[warning]" not in broken.stdout and "archive" not in broken.stdout.lower()
