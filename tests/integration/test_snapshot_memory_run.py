"""A whole snapshot of a table several times larger than its run's memory completes.

``test_snapshot_memory.py`` runs one chunk task on its own; this test runs the **whole**
snapshot (``run_snapshot``: slot, plan, every chunk as a Spark task on a real ``local[2]``
session, the bronze and silver commits through delta-rs) in a child process, so that the
child has a Spark session of its own with:

* Python workers capped by Spark itself: ``spark.executor.pyspark.memory`` = 896 MiB. PySpark
  4.2's ``worker.py`` (``worker_util.setup_memory_limits``) turns the
  ``PYSPARK_EXECUTOR_MEMORY_MB`` the JVM passes into ``RLIMIT_AS`` of each worker, in local
  mode too (the probe below reads the limit back in the workers). The JVM gives each worker
  the whole value (it divides by ``spark.executor.cores``, 1 unless set).
* a JVM heap of 512 MiB (``spark.driver.memory``; ``Runtime.maxMemory()`` is checked). The
  rows never pass through the JVM: tasks hand back file names and counts only.
* the driver's Python process capped with ``RLIMIT_DATA`` at its size after start-up plus
  ``DRIVER_HEADROOM``, set once the JVM runs: limits are inherited at fork, so this one
  reaches neither the JVM nor the Python workers the JVM starts (a JVM does not start under
  an address-space cap: it reserves gigabytes it never touches).

The table holds 5.1 GB of text (1.25M rows of 4 KiB): 5.4 times a worker's cap, and more
than all the caps of the run together. It is read in two chunks of about 2.6 GB, each
nearly three times the cap of the worker that reads it.

``RLIMIT_AS`` counts address space, not resident memory. With pyarrow's default mimalloc
pool a worker reserves about 1.1 GiB at its first allocation (measured: a 768 MiB cap then
fails with ``ArrowMemoryError`` at 126 MB resident; 2 GiB passes with VmPeak 1.75 GB and
300 MB resident). So the child runs, as ``test_snapshot_memory.py`` does, with the system
allocator and a fixed mmap threshold (freed buffers leave the address space at once), plus
``MALLOC_ARENA_MAX=2`` and one OpenBLAS thread (no per-thread reservations). Measured on the
2-core machine: a worker's address space is ~520 MB once the chunk code is loaded and peaks
at ~635 MB during the snapshot (256 MB resident), the same for 1 GB chunks, 2.6 GB chunks
or one 4 GB chunk; the snapshot takes 17-18 s, the whole test about 55 s.

Controls, in the same child and session: the probe reads ``RLIMIT_AS`` back in the workers;
a sampler of ``/proc`` records every worker's peak address space (never above the cap); the
driver cannot allocate past its cap (``MemoryError``); and the same workers cannot snapshot
a table whose first row is as large as their cap ("cannot allocate memory for input
buffer"), so the limit binds the data they read. (Without a cap that table snapshots: a
768 MB row took 4.8 GB resident, measured once by hand.)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.snapshot_state import SnapshotLog, progress_uri
from pgcdc_dagster.lake.delta import open_table
from pgcdc_dagster.lake.paths import table_uri

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
WORKER_MB = 896
WORKER_CAP = WORKER_MB << 20
DRIVER_MEMORY = "512m"
DRIVER_HEADROOM = 256 << 20
ROWS = 1_250_000
REPEAT = 128  # x 32 hex chars of md5(id): 4 KiB of text per row
ROW_TEXT = 32 * REPEAT
CHUNKS = 2
SLOT = "memrun"
ALLOCATOR_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_MMAP_THRESHOLD_": "131072",
                 "MALLOC_ARENA_MAX": "2", "OPENBLAS_NUM_THREADS": "1"}
MEMORY_ERROR = re.compile(r"cannot allocate memory|out of memory|MemoryError", re.IGNORECASE)

# The control's huge row is stored first, so it is the first row its COPY sends: libpq then
# reports the failed allocation ("cannot allocate memory for input buffer"). Behind other
# rows, the same failure reaches psycopg2 2.9.13 (libpq 17) without a message ("error with
# status PGRES_COPY_OUT and no message from the libpq"; measured with a plain psycopg2 COPY
# under the same limit).
SCHEMA = f"""
CREATE TABLE big (id int PRIMARY KEY, body text, n numeric(12,2), at timestamptz);
INSERT INTO big SELECT g, repeat(md5(g::text), {REPEAT}), g / 3.0,
    timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'
    FROM generate_series(1, {ROWS}) g;
CREATE TABLE huge (LIKE big INCLUDING ALL);
INSERT INTO huge VALUES (0, repeat('x', {WORKER_CAP}), 0, now());
INSERT INTO huge SELECT g, repeat(md5(g::text), {REPEAT}), g / 3.0, now()
    FROM generate_series(1, 1000) g;
ANALYZE big, huge;
"""
EXPECTED_SQL = """SELECT count(*), sum(id)::bigint, sum(n), min(at), max(at),
                         sum(octet_length(body))::bigint FROM big"""


def _status(key: str, pid: int | str = "self") -> int:
    """A ``Vm*`` field of /proc/<pid>/status in bytes (0 when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _create_tables(pg_conn) -> None:
    with pg_conn.cursor() as cur:
        try:  # lz4 compresses the repeated text four times faster than pglz
            cur.execute("SET default_toast_compression = lz4")
        except psycopg2.Error:
            pass
        cur.execute(SCHEMA)


def _child(dsn: str, lakehouse: Path, control: Path,
           chunk_bytes: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               **ALLOCATOR_ENV)
    return subprocess.run([sys.executable, "-m", "tests.integration.test_snapshot_memory_run",
                           dsn, str(lakehouse), str(control), str(chunk_bytes)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def _batches(uri: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """The table's rows a few thousand at a time (never the whole table in memory)."""
    for path in DeltaTable(uri).file_uris():
        yield from pq.ParquetFile(path).iter_batches(batch_size=4096, columns=columns)


def _check_bodies(ids: pa.Array, body: pa.Array) -> None:
    """Every row's text is exactly repeat(md5(id), REPEAT)."""
    prefix = pc.utf8_slice_codeunits(body, 0, 32)
    assert pc.all(pc.equal(body, pc.binary_repeat(prefix, REPEAT))).as_py()
    expected = [hashlib.md5(str(i).encode()).hexdigest() for i in ids.to_pylist()]
    assert prefix.to_pylist() == expected


def _check_silver(uri: str, expected: tuple) -> None:
    rows, id_sum, body_bytes, n_sum = 0, 0, 0, 0
    ids, ats = [], []
    for batch in _batches(uri, ["id", "body", "n", "at", "__deleted"]):
        assert not pc.any(batch["__deleted"]).as_py()
        _check_bodies(batch["id"], batch["body"])
        rows += batch.num_rows
        id_sum += pc.sum(batch["id"]).as_py()
        body_bytes += pc.sum(pc.binary_length(batch["body"])).as_py()
        n_sum += pc.sum(batch["n"]).as_py()
        ids.append(batch["id"])
        ats.append(batch["at"])
    at = pc.min_max(pa.chunked_array(ats)).as_py()
    assert pc.count_distinct(pa.chunked_array(ids)).as_py() == rows
    assert (rows, id_sum, n_sum, at["min"], at["max"], body_bytes) == expected


def _check_bronze(uri: str, expected: tuple) -> None:
    rows, id_sum, body_bytes = 0, 0, 0
    for batch in _batches(uri, ["key", "op", "after"]):
        assert pc.all(pc.equal(batch["op"], "r")).as_py()
        ids = pc.struct_field(batch["after"], "id")
        body = pc.struct_field(batch["after"], "body")
        assert pc.all(pc.equal(pc.struct_field(batch["key"], "id"), ids)).as_py()
        _check_bodies(ids, body)
        rows += batch.num_rows
        id_sum += pc.sum(ids).as_py()
        body_bytes += pc.sum(pc.binary_length(body)).as_py()
    assert (rows, id_sum, body_bytes) == (expected[0], expected[1], expected[5])


def test_whole_snapshot_larger_than_its_memory_completes(pg_dsn, pg_conn, tmp_path) -> None:
    _create_tables(pg_conn)
    with pg_conn.cursor() as cur:
        cur.execute(EXPECTED_SQL)
        expected = tuple(cur.fetchone())
        cur.execute("SELECT pg_relation_size('big')")
        heap = int(cur.fetchone()[0])
    text_bytes = expected[5]
    assert expected[0] == ROWS and text_bytes == ROWS * ROW_TEXT
    assert text_bytes >= 5 * WORKER_CAP
    lakehouse, control = tmp_path / "lakehouse", tmp_path / "control"

    started = time.monotonic()
    proc = _child(pg_dsn, lakehouse, control, heap // CHUNKS + 1)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    print(f"child {time.monotonic() - started:.1f}s: {json.dumps(out)}")
    assert out["error"] is None, out["error"]

    # The limits were in force.
    assert out["workers"], "the probe reached no Python worker"
    for worker in out["workers"]:
        assert worker["env_mb"] == str(WORKER_MB), worker
        assert worker["rlimit_as"] == WORKER_CAP, worker
    assert 0 < out["jvm_max_heap"] <= 512 << 20
    assert out["driver"]["control"] == "MemoryError"
    # More text than every cap of the run together (two workers, the JVM heap, the driver).
    assert text_bytes > 2 * WORKER_CAP + out["jvm_max_heap"] + out["driver"]["limit"]
    peaks = out["worker_peaks"]
    assert peaks and max(p["vm_peak"] for p in peaks) <= WORKER_CAP
    loaded = max(w["vm_size"] for w in out["workers"])
    assert sum(1 for p in peaks if p["vm_peak"] > loaded) >= 2, \
        "both executor slots' workers read chunks"

    # The snapshot completed: every chunk larger than the worker that read it.
    assert out["rows"] == ROWS and out["tables"] == ["public.big"]
    state = SnapshotLog(progress_uri(str(lakehouse), SLOT)).load()
    assert state is not None and state.finished
    chunk_rows = [c.rows for c in state.chunks[("public", "big")].values()]
    assert len(chunk_rows) == CHUNKS and sum(chunk_rows) == ROWS
    assert min(chunk_rows) * ROW_TEXT > WORKER_CAP
    _check_silver(table_uri(str(lakehouse), "silver", "public", "big"), expected)
    _check_bronze(table_uri(str(lakehouse), "bronze", "public", "big"), expected)

    # The control: the same workers cannot hold one row as large as their cap.
    assert out["control"] is not None, "a row as large as the cap was snapshotted"
    assert MEMORY_ERROR.search(out["control"]), out["control"]
    for layer in ("bronze", "silver"):
        assert open_table(table_uri(str(control), layer, "public", "huge")) is None


# --- the child process ------------------------------------------------------------------

def _probe(_index: int) -> dict[str, Any]:
    """In a Python worker: its memory limit, once the chunk code is loaded."""
    import pgcdc_dagster.spark.snapshot_tasks  # noqa: F401  (what a chunk task loads)

    return {"pid": os.getpid(), "env_mb": os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB"),
            "rlimit_as": resource.getrlimit(resource.RLIMIT_AS)[0],
            "vm_size": _status("VmSize")}


class _WorkerSampler:
    """Peak address space and resident size of this process's Python workers (``/proc``)."""

    def __init__(self) -> None:
        self.peaks: dict[int, dict[str, int]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _parent(pid: int) -> int:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    def _ours(self, pid: int) -> bool:
        """A descendant of this process (worker -> pyspark's daemon -> JVM -> us)."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if args[1:3] != [b"-m", b"pyspark.daemon"]:
                return False  # (the JVM's command line names the daemon in a --conf)
            for _ in range(6):
                pid = self._parent(pid)
                if pid == os.getpid():
                    return True
                if pid <= 1:
                    return False
        except (OSError, ValueError, IndexError):
            pass
        return False

    def _loop(self) -> None:
        while not self.stop.is_set():
            for name in os.listdir("/proc"):
                if name.isdigit() and self._ours(int(name)):
                    peak = self.peaks.setdefault(int(name), {"vm_peak": 0, "vm_hwm": 0})
                    peak["vm_peak"] = max(peak["vm_peak"], _status("VmPeak", name))
                    peak["vm_hwm"] = max(peak["vm_hwm"], _status("VmHWM", name))
            self.stop.wait(0.1)

    def __enter__(self) -> _WorkerSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def main(argv: list[str]) -> None:
    """Child: a capped Spark session, the whole snapshot, then the control."""
    from pgcdc_dagster.capture.settings import CaptureSettings
    from pgcdc_dagster.capture.snapshot import run_snapshot
    from pgcdc_dagster.spark.session import build_session

    dsn, lakehouse, control, chunk_bytes = argv[0], argv[1], argv[2], int(argv[3])
    out: dict[str, Any] = {}
    started = time.monotonic()
    spark = build_session(app_name="pgcdc-memory-run", driver_memory=DRIVER_MEMORY,
                          conf={"spark.executor.pyspark.memory": f"{WORKER_MB}m"})
    sc = spark.sparkContext
    out["jvm_max_heap"] = int(sc._jvm.java.lang.Runtime.getRuntime().maxMemory())
    out["workers"] = sc.parallelize(range(4), 4).map(_probe).collect()
    out["session_s"] = round(time.monotonic() - started, 1)

    with _WorkerSampler() as sampler:
        # The driver's cap, now that the JVM runs; its own control first.
        limit = _status("VmData") + DRIVER_HEADROOM
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        try:
            block = bytearray(DRIVER_HEADROOM + (64 << 20))
            del block
            out["driver"] = {"control": "allocated"}
        except MemoryError:
            out["driver"] = {"control": "MemoryError"}
        out["driver"]["limit"] = limit

        settings = CaptureSettings(dsn=dsn, lakehouse=lakehouse, include=(r"public\.big",),
                                   slot=SLOT, publication=SLOT, snapshot_chunk_bytes=chunk_bytes)
        started = time.monotonic()
        out["error"] = None
        try:
            report = run_snapshot(settings, spark, force=True)
            out["rows"] = report.rows
            out["tables"] = [t.table for t in report.tables]
        except Exception as exc:  # reported to the test, which shows it
            out["error"] = f"{type(exc).__name__}: {exc}"[:3000]
        out["snapshot_s"] = round(time.monotonic() - started, 1)
    out["worker_peaks"] = [{"pid": pid, **p} for pid, p in sorted(sampler.peaks.items())]
    out["driver"]["vm_data_after"] = _status("VmData")
    out["driver"]["vm_hwm"] = _status("VmHWM")

    started = time.monotonic()
    huge = CaptureSettings(dsn=dsn, lakehouse=control, include=(r"public\.huge",),
                           slot="memctl", publication="memctl")
    try:
        run_snapshot(huge, spark, force=True)
        out["control"] = None
    except Exception as exc:
        out["control"] = f"{type(exc).__name__}: {exc}"[:3000]
    out["control_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
