"""When a run needs Spark, the JVM's start overlaps the run's other work (issue 16, item 1).

* The snapshot step asks for the session (a quick start) before it creates the slot with the
  exported snapshot, plans the chunks and prepares the Delta tables, and waits for it only
  when the first Spark job runs: the session's build here blocks until the slot exists, so
  the step would hang if it waited for the session first; the step's timeline (marks taken
  on the step's thread as it goes) puts the start before the slot's creation.
* A process started to execute ``initial_snapshot`` starts the JVM while Dagster loads the
  code and creates the run: the job is read from its command line (``dagster job execute``,
  or a run worker's serialized arguments, as Dagster writes them), the session is shared by
  the process, and the start happens only when the snapshot is bound to read chunks.
"""

from __future__ import annotations

import subprocess
import sys
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
from pgcdc_dagster.postgres.local_cluster import free_port
from pgcdc_dagster.resources import CaptureResource, SparkResource
from pgcdc_dagster.spark import session
from pgcdc_dagster.spark.lazy import LazySpark
from pgcdc_dagster.spark.prestart import (
    DEFAULT_APP_NAME,
    DEFAULT_MASTER,
    DEFAULT_MODE,
    DEFAULT_SLOT,
    job_of_process,
    shared_handle,
    snapshot_will_read,
)
from pgcdc_dagster.spark.session import QUICK_START_JAVA_OPTIONS, session_settings
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

    def build() -> object:
        """The JVM's start, as the step sees it: it lasts until the slot exists."""
        deadline = time.monotonic() + 60
        while not _slot_exists(pg_dsn):
            if time.monotonic() > deadline:
                seen.append("the slot was never created while Spark started")
                break
            time.sleep(0.05)
        else:
            seen.append("slot created while Spark started")
        return spark.sparkContext

    # A quick start, and the context only: the snapshot's chunks need no SQL session.
    handle = LazySpark(lambda: pytest.fail("a snapshot builds no SQL session"),
                       quick_build=build)  # type: ignore[arg-type]
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(tmp_path), include=("public\\..*",),
                               slot=SLOT, publication=SLOT)
    lines: list[str] = []
    report = run_snapshot(settings, handle, force=True, progress=lines.append)

    assert seen == ["slot created while Spark started"]  # awaited only for the chunks
    assert report.rows == 500 and report.chunks_read >= 1
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


def test_one_session_handle_per_process_and_settings() -> None:
    # The definitions' resource and the run's (Dagster re-creates it from its config) share
    # the handle, so a start asked for before the run is the run's session.
    assert SparkResource(master="local[3]").lazy() is SparkResource(master="local[3]").lazy()
    assert SparkResource(master="local[3]").lazy() is not \
        SparkResource(master="local[3]", conf={"spark.x": "1"}).lazy()
    assert not SparkResource(master="local[3]", app_name="never-started").lazy().created
    # What the code location's module starts before the run is what the run's default
    # resources use.
    assert SparkResource().lazy() is shared_handle(DEFAULT_MASTER)
    assert (SparkResource().master, SparkResource().app_name) == (DEFAULT_MASTER,
                                                                  DEFAULT_APP_NAME)
    assert (CaptureResource().slot, CaptureResource().snapshot_mode) == (DEFAULT_SLOT,
                                                                          DEFAULT_MODE)


def test_a_quick_start_compiles_less_and_keeps_the_users_java_options(monkeypatch) -> None:
    quick = session_settings("local[2]", {"spark.driver.extraJavaOptions": "-Dmine=1"},
                             quick_start=True)
    # The user's options come last: the JVM's last option wins.
    assert quick["spark.driver.extraJavaOptions"] == f"{QUICK_START_JAVA_OPTIONS} -Dmine=1"
    assert "spark.driver.extraJavaOptions" not in session_settings("local[2]")
    assert session_settings("spark://h:7077", quick_start=True)[
        "spark.driver.extraJavaOptions"] == QUICK_START_JAVA_OPTIONS
    # Spark's launcher JVM (it only prints the driver JVM's command) compiles less too,
    # for any master, unless the user gave its options.
    monkeypatch.delenv(session.LAUNCHER_OPTIONS_ENV, raising=False)
    session._environment("spark://h:7077")
    launcher = session.os.environ[session.LAUNCHER_OPTIONS_ENV]
    assert launcher == session.launcher_java_options()  # with its class archive, if any
    assert launcher.startswith(session.LAUNCHER_JAVA_OPTIONS)
    monkeypatch.setenv(session.LAUNCHER_OPTIONS_ENV, "-Xmx64m")
    session._environment("local[2]")
    assert session.os.environ[session.LAUNCHER_OPTIONS_ENV] == "-Xmx64m"


@pytest.mark.integration
def test_a_prestart_only_when_the_snapshot_will_read(pg_dsn, pg_conn) -> None:
    assert snapshot_will_read(pg_dsn, "prestart_slot", "initial")  # no slot: a snapshot
    assert snapshot_will_read(pg_dsn, "prestart_slot", "when_needed")
    for mode in ("no_data", "never", "initial_only"):
        assert not snapshot_will_read(pg_dsn, "prestart_slot", mode)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT pg_create_logical_replication_slot('prestart_slot', 'pgoutput')")
    try:
        assert not snapshot_will_read(pg_dsn, "prestart_slot", "initial")  # nothing to read
        assert snapshot_will_read(pg_dsn, "prestart_slot", "always")
    finally:
        with pg_conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot('prestart_slot')")
    # An unreachable source: no start (the run reports the problem).
    assert not snapshot_will_read(f"host=127.0.0.1 port={free_port()} dbname=x user=y "
                                  "connect_timeout=2", "s", "initial")
    # The JVM's launch waits for this check only: it imports neither the capture modules nor
    # the chunk reader (pyarrow, deltalake: tenths of a second the code location imports
    # meanwhile), nor does asking for the start.
    probe = ("import sys; from pgcdc_dagster.spark.prestart import shared_handle, "
             "snapshot_will_read; assert snapshot_will_read(sys.argv[1], 'prestart_x', "
             "'initial'); shared_handle('local[2]'); "
             "print(sorted(m for m in ('pyarrow', 'deltalake', 'pyspark', "
             "'pgcdc_dagster.capture.snapshot_modes', 'pgcdc_dagster.spark.snapshot_tasks') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe, pg_dsn], capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_background_start_switches_threads_often_then_restores_the_interval() -> None:
    """The starting thread's py4j calls wait for the GIL at most the switch interval each
    while another thread runs Python: a background start shortens it, and puts it back."""
    import sys
    import threading

    from pgcdc_dagster.spark.lazy import START_SWITCH_INTERVAL, quick_switches

    seen: list[float] = []
    release = threading.Event()

    def build() -> object:
        seen.append(sys.getswitchinterval())
        release.wait(30)
        return object()

    before = sys.getswitchinterval()
    handle = LazySpark(lambda: pytest.fail("no SQL session"),  # type: ignore[arg-type]
                       quick_build=build)  # type: ignore[arg-type]
    handle.start(on_ready=lambda _spark: seen.append(sys.getswitchinterval()), quick=True)
    with quick_switches():  # a second start under way meanwhile
        release.set()
        handle.tasks()
        assert sys.getswitchinterval() == START_SWITCH_INTERVAL  # the other start's still
    assert seen == [START_SWITCH_INTERVAL, START_SWITCH_INTERVAL]  # build and its hooks
    assert sys.getswitchinterval() == before  # restored when the last start ended
    # An interval someone else set meanwhile is theirs: not overwritten.
    try:
        with quick_switches():
            sys.setswitchinterval(0.002)
        assert sys.getswitchinterval() == 0.002
    finally:
        sys.setswitchinterval(before)
