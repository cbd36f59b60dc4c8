"""A class-data archive of the Spark driver JVM: the session starts in less than half the time.

A new Spark session's JVM spends most of its start loading and verifying thousands of Spark
and Scala classes from the jars. The JVM can map them from an archive instead (AppCDS:
``-XX:SharedArchiveFile``). ``python -m pgcdc_dagster.spark.class_archive`` writes one once
per installation (a session started with ``-XX:ArchiveClassesAtExit``, one small Python task
run, the JVM stopped and waited for); from then on every session this project builds maps it
(:func:`java_options`): on this two-core machine at load ~10 the session came up in 6 s
instead of 14-16 s. The archive is put in place only once a new JVM has mapped it and run a
job (a JVM that maps a truncated archive crashes, so one is never left where it is looked
for).

The archive is tied to the Java executable and the Spark jars: its file name carries a digest
of both (:func:`archive_path`), so after an upgrade the old one is simply not found (and the
JVM itself checks an archive it maps; one it cannot use is ignored, ``-Xshare:auto``).
Without an archive nothing changes. ``PGCDC_SPARK_CLASS_ARCHIVE_DIR`` chooses the directory
(default ``$XDG_CACHE_HOME/pgcdc_dagster``, else ``~/.cache/pgcdc_dagster``).

The same module writes a second, small archive for **Spark's launcher** (``spark-class`` runs
``org.apache.spark.launcher.Main`` in a JVM of its own, only to print the driver JVM's
command line, before every driver JVM starts): its class path is the ~280 Spark jars, which
it opened one after the other to find its few classes (0.18-0.2 CPU s); with the archive
mapped, 0.06-0.07 (:func:`launcher_options`, in ``SPARK_LAUNCHER_OPTS``:
``spark/session.py``). Its own log lines go to standard error: ``spark-class`` reads the
command from its standard output.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from pgcdc_dagster.cache import cache_dir

ARCHIVE_DIR_ENV = "PGCDC_SPARK_CLASS_ARCHIVE_DIR"


def _java() -> str:
    """The Java executable pyspark's launcher runs (``JAVA_HOME``, else ``java`` on PATH)."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found else ""


def _spark_jars() -> list[str]:
    """The Spark jars as the JVM checks them against an archive: their directory (the class
    path is part of the archive), and each jar's name, size and modification time (another
    installation of the same Spark, e.g. a second venv, gets an archive of its own instead
    of one the JVM refuses with a warning on the driver's output)."""
    from pgcdc_dagster.spark.gateway import spark_home  # pyspark itself not imported

    jars = Path(spark_home()).resolve() / "jars"
    try:
        stats = sorted((p.name, p.stat()) for p in jars.iterdir() if p.suffix == ".jar")
    except OSError:
        return []
    return [str(jars), *(f"{name}:{st.st_size}:{st.st_mtime_ns}" for name, st in stats)]


def archive_dir() -> Path:
    given = os.environ.get(ARCHIVE_DIR_ENV)
    return Path(given) if given else cache_dir()


def _digest() -> str:
    """A digest of the Java executable and the Spark jars (what an archive is tied to)."""
    java = _java()
    try:
        stamp = f"{os.stat(java).st_size}:{os.stat(java).st_mtime_ns}" if java else ""
    except OSError:
        stamp = ""
    return hashlib.sha256("\n".join([java, stamp, *_spark_jars()]).encode()).hexdigest()[:16]


def archive_path() -> Path:
    """Where the archive of this Java and these Spark jars is (or would be) written."""
    return archive_dir() / f"spark-driver-{_digest()}.jsa"


def launcher_archive_path() -> Path:
    """Where the launcher's archive of this Java and these Spark jars is (or would be)."""
    return archive_dir() / f"spark-launcher-{_digest()}.jsa"


LAUNCHER_LOGGING = "-Xlog:disable -Xlog:all=warning:stderr"
"""The launcher JVM's log lines (a warning about an archive it cannot map, say) go to
standard error: ``spark-class`` takes its standard output for the driver's command."""


def launcher_options() -> str:
    """Launcher JVM options that map its archive, when there is one ("" otherwise)."""
    path = launcher_archive_path()
    return f"-XX:SharedArchiveFile={path} {LAUNCHER_LOGGING}" if path.is_file() else ""


def java_options() -> str:
    """Driver JVM options that map the archive, when there is one ("" otherwise)."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path.is_file() else ""


def _write_task(index: int) -> int:
    return index


_CHECK = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").appName("pgcdc-class-archive-check")
         .config("spark.ui.enabled", "false").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.extraJavaOptions",
                 "-Xshare:on -XX:SharedArchiveFile=" + sys.argv[1]).getOrCreate())
assert spark.range(10).count() == 10
spark.stop()
"""
"""A JVM that must map the archive (``-Xshare:on``) starts a session and runs a job."""


def write_archive(path: Path | None = None) -> Path:
    """Start a session that writes the archive when its JVM exits, run a task, stop the JVM,
    wait for it, check that a new JVM maps the archive and runs a job, and only then put it in
    place (atomically: a JVM that maps a truncated archive crashes). Returns its path.

    Raises:
        RuntimeError: the JVM wrote no archive, or one that a JVM cannot map.
    """
    from pgcdc_dagster.spark.session import QUICK_START_JAVA_OPTIONS, build_session

    target = path or archive_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    session = build_session(app_name="pgcdc-class-archive", conf={
        "spark.driver.extraJavaOptions":
            f"{QUICK_START_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={partial} -Xlog:cds*=off"},
        class_archive=False)
    sc = session.sparkContext
    sc.parallelize(range(2), 2).map(_write_task).collect()
    gateway: Any = sc._gateway  # pyspark's own launch of the JVM (a subprocess.Popen)
    jvm = gateway.proc
    session.stop()
    gateway.shutdown()
    if jvm.stdin is not None:
        jvm.stdin.close()  # the JVM exits on its standard input's end, writing the archive
    code = jvm.wait(timeout=300)
    try:
        if code != 0 or not partial.is_file() or partial.stat().st_size == 0:
            raise RuntimeError(f"the JVM (exit code {code}) wrote no class archive at {partial}")
        check = subprocess.run([sys.executable, "-c", _CHECK, str(partial)],
                               capture_output=True, text=True, timeout=300)
        if check.returncode != 0:
            raise RuntimeError(f"a JVM could not use the class archive {partial} (removed): "
                               f"{check.stderr[-2000:]}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def _launch(options: str) -> subprocess.CompletedProcess[str]:
    """``spark-class`` printing Spark's version, its launcher JVM run with ``options``."""
    from pgcdc_dagster.spark.gateway import spark_home
    from pgcdc_dagster.spark.session import LAUNCHER_JAVA_OPTIONS, LAUNCHER_OPTIONS_ENV

    env = {**os.environ,
           LAUNCHER_OPTIONS_ENV: f"{LAUNCHER_JAVA_OPTIONS} {LAUNCHER_LOGGING} {options}"}
    command = [os.path.join(spark_home(), "bin", "spark-class"),
               "org.apache.spark.deploy.SparkSubmit", "--conf", "spark.master=local[1]",
               "--version", "pyspark-shell"]  # a driver's arguments; the driver only prints
    return subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=300)


def write_launcher_archive(path: Path | None = None) -> Path:
    """Run Spark's launcher as a driver's start does, writing its archive at its exit; check
    that a launcher JVM maps it (``-Xshare:on``) and still prints a command that runs; only
    then put it in place. Returns its path.

    Raises:
        RuntimeError: no archive written, or one the launcher cannot map.
    """
    target = path or launcher_archive_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        written = _launch(f"-XX:ArchiveClassesAtExit={partial}")
        if written.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            raise RuntimeError(f"Spark's launcher (exit code {written.returncode}) wrote no "
                               f"class archive at {partial}: {written.stderr[-2000:]}")
        check = _launch(f"-Xshare:on -XX:SharedArchiveFile={partial}")
        if check.returncode != 0:
            raise RuntimeError(f"Spark's launcher could not use the class archive {partial} "
                               f"(removed): {check.stderr[-2000:]}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def main() -> None:
    """Write the driver's archive (to the path given, or where it is looked for when it is
    missing there), then the launcher's when it is missing."""
    if len(sys.argv) > 1 or not archive_path().is_file():
        path = write_archive(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
        print(f"Spark driver class archive written: {path} ({path.stat().st_size >> 20} MiB)")
    if not launcher_archive_path().is_file():
        path = write_launcher_archive()
        print(f"Spark launcher class archive written: {path} "
              f"({path.stat().st_size >> 10} KiB)")


if __name__ == "__main__":
    main()
