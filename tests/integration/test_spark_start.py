"""When a snapshot needs Spark, the session's start overlaps the step's other work; a small
snapshot never starts Spark.

* The snapshot step asks for the session before it creates the slot with the exported
  snapshot, plans the chunks and prepares the Delta tables, and waits for it only when the
  first Spark job runs: the session's build here blocks until the slot exists, so the step
  would hang if it waited for the session first; the step's timeline (marks taken on the
  step's thread as it goes) puts the start before the slot's creation.
* Below ``snapshot_spark_threshold_rows`` the chunks are read in the process: the handle is
  never started, and the results name no executor.
* The job a process was started for is read from its command line (lean definitions).
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg2
import pytest
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import serialize_value

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import run_snapshot
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.run_process import job_of_process
from pgcdc_dagster.spark.lazy import LazySpark
from pgcdc_dagster.spark.session import Opened
from tests.support.compare import assert_silver_equals_source

SLOT = "early_spark"


def _slot_exists(dsn: str) -> bool:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
            return cur.fetchone() is not None
    finally:
        conn.close()


@pytest.mark.integration
@pytest.mark.spark
def test_spark_starts_before_the_slot_and_is_awaited_for_the_chunks(
        pg_dsn, pg_conn, spark, tmp_path: Path) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE early (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO early SELECT g, 'v' || g FROM generate_series(1, 500) g")
    seen: list[str] = []

    def build() -> Opened:
        """The session's start, as the step sees it: it lasts until the slot exists."""
        deadline = time.monotonic() + 60
        while not _slot_exists(pg_dsn):
            if time.monotonic() > deadline:
                seen.append("the slot was never created while Spark started")
                break
            time.sleep(0.05)
        else:
            seen.append("slot created while Spark started")
        return Opened(spark, owned=False, kind="given")

    handle = LazySpark(build)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(tmp_path), include=("public\\..*",),
                               slot=SLOT, publication=SLOT, snapshot_spark_threshold_rows=0)
    lines: list[str] = []
    report = run_snapshot(settings, handle, force=True, progress=lines.append)

    assert seen == ["slot created while Spark started"]  # awaited only for the chunks
    assert report.rows == 500 and report.chunks_read >= 1 and report.spark_tasks >= 1
    assert report.executors and all(":" in e for e in report.executors)  # Python workers
    events = [event for event, _ in report.timeline]
    order = ["step start", "spark start", "slot created", "planned", "spark needed",
             "first chunk", "chunks read", "committed"]
    assert [e for e in events if e in order] == order, report.timeline
    assert events.index("spark start") < events.index("spark ready") < \
        events.index("first chunk"), report.timeline
    assert any(line.startswith("snapshot timeline") and "spark start" in line
               for line in lines), lines
    assert_silver_equals_source(pg_conn, table_uri(str(tmp_path), "silver", "public", "early"),
                                "public", "early", ["id"])

    # Below the threshold (the default, 1M rows): read in this process, Spark never started.
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE small (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO small SELECT g, 'v' || g FROM generate_series(1, 300) g")
    idle = LazySpark(lambda: pytest.fail("a small snapshot starts no Spark"))
    small = CaptureSettings(dsn=pg_dsn, lakehouse=str(tmp_path / "small"),
                            include=("public\\.small",), slot="small_snap",
                            publication="small_snap")
    lines.clear()
    report = run_snapshot(small, idle, force=True, progress=lines.append)
    assert report.rows == 300 and report.spark_tasks == 0 and report.executors == []
    assert not idle.created
    assert any("without Spark" in line for line in lines), lines
    assert_silver_equals_source(pg_conn, table_uri(str(tmp_path / "small"), "silver", "public",
                                                   "small"), "public", "small", ["id"])


def test_the_job_of_a_process_is_read_from_its_command_line() -> None:
    cli = ["/venv/bin/dagster", "job", "execute", "-m", "pgcdc_dagster.definitions"]
    assert job_of_process([*cli, "-j", "initial_snapshot"], {}) == "initial_snapshot"
    assert job_of_process([*cli, "--job", "cdc_microbatch"], {}) == "cdc_microbatch"
    assert job_of_process([*cli, "--job=initial_snapshot"], {}) == "initial_snapshot"
    assert job_of_process(cli, {}) is None
    # A run worker launched by the daemon or the webserver: the arguments as Dagster writes
    # them (its own serializer), on the command line or in the environment.
    origin = JobPythonOrigin("initial_snapshot", RepositoryPythonOrigin(
        "/venv/bin/python", ModuleCodePointer("pgcdc_dagster.definitions", "defs", None)))
    args = serialize_value(ExecuteRunArgs(job_origin=origin, run_id="r1", instance_ref=None))
    worker = ["/venv/bin/dagster", "api", "execute_run"]
    assert job_of_process([*worker, args], {}) == "initial_snapshot"
    assert job_of_process(worker, {"DAGSTER_EXECUTE_RUN_ARGS": args}) == "initial_snapshot"
    for other in (["/venv/bin/dagster", "dev"], ["/venv/bin/dagster", "api", "grpc"],
                  ["pytest", "-j", "initial_snapshot"], [*worker, "{not json"]):
        assert job_of_process(other, {}) is None


@pytest.mark.spark
def test_slots_asked_for_while_the_session_starts_with_its_warm_up(spark) -> None:
    """A cluster's slots are found by the warm-up job: asked for on the run's thread while the
    background start's own warm-up hook waits to run, neither waits for the other forever."""
    import threading

    def slow_build() -> Opened:
        time.sleep(0.5)  # the run's thread asks for the slots meanwhile
        return Opened(spark, owned=False, kind="given")

    handle = LazySpark(slow_build, "spark://cluster.example:7077")  # slots not in the URL
    handle.start(on_ready=LazySpark.warm)
    found: list[int] = []
    asking = threading.Thread(target=lambda: found.append(handle.parallelism()), daemon=True)
    asking.start()
    asking.join(300)
    assert found == [2]  # local[2]: one warm-up task per slot
    assert [e for e, _ in handle.timeline()].count("workers ready") == 1
    handle.close()  # a given session: left running
    assert spark.range(3).count() == 3
