"""The Python worker daemon of local sessions imports the snapshot chunks' modules once,
before it forks the workers (issue 16: the first chunk soon after the slot exists)."""

from __future__ import annotations

import gc
import os
import sys

import pyspark
import pytest

from pgcdc_dagster.spark import snapshot_tasks, worker_daemon
from pgcdc_dagster.spark.lazy import LazySpark
from pgcdc_dagster.spark.session import DAEMON_MODULE_CONF, session_settings
from pgcdc_dagster.spark.snapshot_tasks import warm_workers


def _inherited(_index: int
               ) -> tuple[int, int, int | None, bool, str, list[str], int, int]:
    """On a worker: its PID, its parent's, the PID of the process that preloaded the
    chunk reader (inherited across the fork), whether the decoder is loaded, where pyspark
    was imported from, the ``sys.path`` entries that are zips, and the objects frozen out
    of the collector's reach and those it walks in a full collection."""
    import gc

    import pyspark

    from pgcdc_dagster.spark import worker_daemon as daemon

    return (os.getpid(), os.getppid(), daemon.PRELOADED_IN,
            "pgcdc_dagster.capture.snapshot_arrow" in sys.modules, str(pyspark.__file__),
            [entry for entry in sys.path if entry.endswith(".zip")],
            gc.get_freeze_count(), len(gc.get_objects()))


def _mapped_for(size: int) -> tuple[str | None, int]:
    """On a worker: ``MIMALLOC_PURGE_DELAY`` and how many bytes glibc mapped on their own
    (``mallinfo2().hblkhd``) to hold a new numpy array of ``size`` bytes."""
    import ctypes
    import os

    import numpy as np

    class MallInfo2(ctypes.Structure):
        _fields_ = tuple((name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost"))

    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = MallInfo2
    before = mallinfo2().hblkhd
    block = np.empty(size, dtype=np.uint8)
    mapped = mallinfo2().hblkhd - before
    del block
    return os.environ.get("MIMALLOC_PURGE_DELAY"), int(mapped)


@pytest.mark.spark
def test_workers_are_forked_from_a_daemon_that_imported_the_chunk_reader(
        spark, monkeypatch) -> None:
    sc = spark.sparkContext
    assert sc.getConf().get(DAEMON_MODULE_CONF) == worker_daemon.DAEMON_MODULE
    monkeypatch.setattr(snapshot_tasks, "_WARMED", set())  # as for a new application
    # A quick start hands out the context; the SQL session is built only when asked for.
    built: list[str] = []
    handle = LazySpark(lambda: built.append("session") or spark,  # type: ignore[func-returns-value]
                       "local[2]", quick_build=lambda: sc)
    handle.start(quick=True)
    assert handle.tasks().sparkContext is sc and built == []
    assert handle.get() is spark and built == ["session"]
    assert handle.get() is spark and built == ["session"]  # once
    # Started by the snapshot as soon as the session is up; noted in its timeline.
    thread = warm_workers(spark, note=handle.note)
    assert thread is not None and warm_workers(spark, note=handle.note) is None  # once
    thread.join(120)
    assert [event for event, _ in handle.timeline()] == ["spark start", "spark ready",
                                                         "workers ready"]
    slots = max(1, int(sc.defaultParallelism))
    seen = sc.parallelize(range(slots * 2), slots * 2).map(_inherited).collect()
    installed = os.path.dirname(os.path.abspath(pyspark.__file__))
    for pid, parent, preloaded_in, decoder, imported_from, zips, frozen, walked in seen:
        # The module state was set in the daemon (the worker's parent), not by the worker.
        assert preloaded_in == parent != pid, seen
        assert decoder, seen
        # What the daemon imported is frozen: pyspark's gc.collect() after each task (and
        # the worker's own full collections) walk only what the tasks created.
        assert frozen > 10 * walked, seen
        # pyspark from the installed package (cached bytecode), not from Spark's zip.
        assert os.path.dirname(imported_from) == installed, seen
        assert not [z for z in zips if z.endswith(("pyspark.zip", "-src.zip"))], seen
    assert worker_daemon.PRELOADED_IN is None  # the driver never ran the daemon's preload
    # Freed memory stays with the workers: a 30 MiB block comes from glibc's heap (below the
    # daemon's mmap threshold, inherited), not from a mapping of its own that its free
    # would hand back to the kernel; mimalloc is told never to purge.
    size = worker_daemon.MMAP_THRESHOLD - (2 << 20)
    probed = sc.parallelize(range(slots), slots).map(lambda _i: _mapped_for(size)).collect()
    assert probed == [("-1", 0)] * slots, probed


def test_spark_zips_give_way_to_the_installed_packages(tmp_path) -> None:
    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    for package in ("pyspark", "py4j"):
        (site / package).mkdir(exist_ok=True)
        (site / package / "__init__.py").write_text("")
    spark_zip, py4j_zip = str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")
    other_home = str(tmp_path / "spark-4.2" / "python" / "lib" / "pyspark.zip")
    path = ["", spark_zip, py4j_zip, "/project", str(site)]
    assert worker_daemon.installed_over_zips(path) == ["", "/project", str(site)]
    # site-packages not on the path: it takes the first zip's place, once.
    assert worker_daemon.installed_over_zips([spark_zip, py4j_zip, "/project"]) == [
        str(site), "/project"]
    # A Spark home that is not the installed package (a distribution's): zips kept.
    assert worker_daemon.installed_over_zips([other_home, "/project"]) == [other_home,
                                                                          "/project"]
    (site / "py4j" / "__init__.py").unlink()  # py4j not installed beside it: its zip stays
    assert worker_daemon.installed_over_zips(path) == ["", py4j_zip, "/project", str(site)]


def test_a_module_that_cannot_be_imported_is_left_to_the_workers(monkeypatch) -> None:
    monkeypatch.setattr(worker_daemon, "PRELOAD",
                        ("pgcdc_dagster.cdc.lsn", "pgcdc_dagster_no_such_module"))
    monkeypatch.setattr(worker_daemon, "PRELOADED_IN", None)
    monkeypatch.setenv(worker_daemon.MIMALLOC_PURGE_ENV, "10")  # a value set wins
    enabled = gc.isenabled()
    try:
        assert worker_daemon.preload() == ["pgcdc_dagster_no_such_module"]  # it serves
        assert worker_daemon.PRELOADED_IN == os.getpid()
        assert gc.get_freeze_count() > 0 and gc.isenabled() == enabled  # collector resumed
        assert os.environ[worker_daemon.MIMALLOC_PURGE_ENV] == "10"
    finally:
        gc.unfreeze()  # this test process's objects back in the collector's reach


def test_only_local_sessions_use_the_daemon_and_the_users_value_wins() -> None:
    assert session_settings("local[2]")[DAEMON_MODULE_CONF] == worker_daemon.DAEMON_MODULE
    assert session_settings("local[*]", quick_start=True)[DAEMON_MODULE_CONF] == \
        worker_daemon.DAEMON_MODULE
    # A cluster's executors may import this project from elsewhere, or not at all.
    assert DAEMON_MODULE_CONF not in session_settings("spark://h:7077")
    assert session_settings("local[2]", {DAEMON_MODULE_CONF: "pyspark.daemon"})[
        DAEMON_MODULE_CONF] == "pyspark.daemon"
