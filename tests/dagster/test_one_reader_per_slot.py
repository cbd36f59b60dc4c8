"""One reader per slot without the Dagster pool, and dead runs noticed.

* Two ``cdc_microbatch`` runs launched at once in two processes on a fresh instance (no pool
  limit), round after round: exactly one reads, the other fails with SlotInUseError naming
  the first and writes nothing; bronze never holds an event twice; silver equals the source.
  The winner is held inside its run (its ``heartbeat.action.query`` waits on an advisory lock
  the test releases) until the loser has finished, so the runs overlap in every round.
* A ``dagster job execute`` run SIGKILLed while it holds the slot's lock stays STARTED; the
  schedule's next tick marks it failed with the reason and requests a run, which succeeds with
  nothing lost or duplicated. A run whose lock is held by a live session (another host) is
  left alone; the slot-lag sensor marks it dead once that session is gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.assets.run_liveness import DEAD_TAG
from pgcdc_dagster.assets.slot_hold import SLOT_LOCK_TAG
from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.postgres.slot_lock import acquire, slot_lock_holder
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
GATE = 918_273  # advisory lock (bigint key space) the winner waits on inside its run
TABLES = [("public", "items")]


def _definitions(dsn: str, lakehouse: Path, slot: str, settings: MonitorSettings | None = None,
                 **capture: object) -> dg.Definitions:
    return build_definitions(TABLES, {
        "postgres": PostgresResource(dsn=dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables="public\\.items", slot=slot, publication=slot,
                                   **capture),  # type: ignore[arg-type]
        "spark": SparkResource(),
    }, settings=settings)


def _stream_events(lakehouse: Path) -> tuple[int, int]:
    """(stream events in bronze, distinct sequences among them)."""
    data = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "items")).to_pyarrow_table(
        columns=["op", "__commit_lsn", "__ordinal"])
    data = data.filter(pc.not_equal(data["op"], "r"))
    distinct = data.group_by(["__commit_lsn", "__ordinal"]).aggregate([]).num_rows
    return data.num_rows, distinct


def _change(conn, round_no: int) -> None:
    with conn.cursor() as cur:
        base = 10_000 * (round_no + 1)
        cur.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(%s, %s) g",
                    (base, base + 1999))
        cur.execute("UPDATE items SET name = name || '+' WHERE id %% 7 = %s", (round_no,))
        cur.execute("DELETE FROM items WHERE id %% 11 = %s AND id < 10000", (round_no,))


def _race(env: dict[str, str], args: list[str], conn) -> list[dict]:
    """Two run workers at once; the winner waits inside its run (at the gate, holding the
    slot's lock) until the loser has ended. Returns their outcomes, the loser's first."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(%s)", (GATE,))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.support.microbatch_runner", *args],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 300
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
    outcomes = []
    for proc in sorted(procs, key=lambda p: p.poll() is None):  # the one that ended first
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        outcomes.append(json.loads(out.strip().splitlines()[-1]))
    return outcomes


def test_two_microbatches_at_once_one_reads_none_duplicates(pg_dsn, pg_conn, spark,
                                                            lakehouse, tmp_path) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        cur.execute("INSERT INTO items SELECT g, 'i' || g FROM generate_series(1, 3000) g")
    slot = "dg_two"
    gate = f"SELECT pg_advisory_lock({GATE}), pg_advisory_unlock({GATE})"
    home = tmp_path / "dagster_home"  # a fresh instance: no pool limit
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = dict(os.environ, DAGSTER_HOME=str(home), PYSPARK_PYTHON=sys.executable)
    definitions = _definitions(pg_dsn, lakehouse, slot)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert definitions.resolve_job_def("initial_snapshot").execute_in_process(
            instance=instance).success
        for round_no in range(3):
            _change(pg_conn, round_no)
            loser, winner = _race(env, [pg_dsn, str(lakehouse), slot, gate], pg_conn)
            assert winner["success"] and not loser["success"], f"round {round_no}"
            [message] = loser["errors"]
            assert "SlotInUseError" in message
            assert f"replication slot '{slot}' is in use: another reader holds its lock" \
                in message
            assert f"Dagster run {winner['run_id']}" in message
            assert instance.get_run_by_id(winner["run_id"]).tags[SLOT_LOCK_TAG]
            lost = instance.get_run_by_id(loser["run_id"])
            assert lost.status == dg.DagsterRunStatus.FAILURE
            assert SLOT_LOCK_TAG not in lost.tags
            assert not instance.get_records_for_run(
                loser["run_id"], of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
            events, distinct = _stream_events(lakehouse)
            assert events == distinct, f"round {round_no}: {events - distinct} duplicated"
    assert slot_lock_holder(pg_dsn, slot) is None  # the runs ended: the lock is free
    assert events > 6000
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "items"),
                                "public", "items", ["id"])


def _tick(definitions: dg.Definitions, instance: dg.DagsterInstance) -> object:
    schedule = definitions.resolve_schedule_def("cdc_microbatch_schedule")
    with dg.build_schedule_context(instance=instance,
                                   resources=definitions.resources) as context:
        return schedule(context)


def _sensor(definitions: dg.Definitions, instance: dg.DagsterInstance) -> dg.SensorResult:
    sensor = definitions.resolve_sensor_def("slot_lag_sensor")
    with dg.build_sensor_context(instance=instance, resources=definitions.resources) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def _failure_message(instance: dg.DagsterInstance, run_id: str) -> str:
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
    assert records
    return str(records[-1].event_log_entry.message)


def test_killed_run_is_noticed_and_the_next_tick_runs(pg_dsn, pg_conn, spark, lakehouse,
                                                      tmp_path) -> None:
    slot = "dg_dead"
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        cur.execute("INSERT INTO items SELECT g, 'i' || g FROM generate_series(1, 3000) g")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    settings = MonitorSettings(dead_run_grace_s=1, lag_trigger_bytes=1)
    definitions = _definitions(pg_dsn, lakehouse, slot, settings)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert definitions.resolve_job_def("initial_snapshot").execute_in_process(
            instance=instance).success
        _change(pg_conn, 0)
        env = dict(os.environ, PGCDC_PG_DSN=pg_dsn, PGCDC_LAKEHOUSE=str(lakehouse),
                   PGCDC_TABLES="public\\.items", PGCDC_SLOT=slot, PGCDC_PUBLICATION=slot,
                   DAGSTER_HOME=str(home), PYSPARK_PYTHON=sys.executable,
                   PGCDC_FAULT_INJECT="after_decode")
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "dagster"), "job", "execute", "-m",
             "pgcdc_dagster.definitions", "-j", "cdc_microbatch"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        [killed] = instance.get_runs(dg.RunsFilter(job_name="cdc_microbatch"))
        assert killed.status == dg.DagsterRunStatus.STARTED  # what Dagster alone leaves
        assert killed.tags[SLOT_LOCK_TAG]  # it died holding the lock

        for _ in range(100):  # the server ends the dead client's session at once
            if slot_lock_holder(pg_dsn, slot) is None:
                break
            time.sleep(0.1)
        time.sleep(1.1)  # the grace period (1 s) since its last event
        request = _tick(definitions, instance)
        assert isinstance(request, dg.RunRequest), request
        assert instance.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.FAILURE
        assert instance.get_run_by_id(killed.run_id).tags[DEAD_TAG] == \
            "cdc_microbatch_schedule"
        reason = _failure_message(instance, killed.run_id)
        assert "marked failed by cdc_microbatch_schedule" in reason
        assert f"nobody holds the lock of replication slot '{slot}'" in reason

        rerun = definitions.resolve_job_def("cdc_microbatch").execute_in_process(
            instance=instance, tags=dict(request.tags))
        assert rerun.success
        events, distinct = _stream_events(lakehouse)
        assert events == distinct and events > 2000
        assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public",
                                                       "items"), "public", "items", ["id"])

        # A run whose lock a live session holds (a worker on another host) is not dead,
        # however quiet; once that session is gone, the lag sensor marks it failed.
        live = dg.DagsterRun(job_name="cdc_microbatch", run_id=str(uuid.uuid4()),
                             status=dg.DagsterRunStatus.STARTED, tags={SLOT_LOCK_TAG: "1"})
        instance.add_run(live)
        _change(pg_conn, 1)
        lease = acquire(pg_dsn, slot, live.run_id)
        try:
            time.sleep(1.1)
            skipped = _tick(definitions, instance)
            assert isinstance(skipped, dg.SkipReason)
            assert f"cdc_microbatch run {live.run_id}" in str(skipped.skip_message)
            assert f"the slot's lock is held: pid {lease.pid}, Dagster run {live.run_id}" in \
                str(skipped.skip_message)
            held = _sensor(definitions, instance)
            assert not held.run_requests
            assert instance.get_run_by_id(live.run_id).status == dg.DagsterRunStatus.STARTED
        finally:
            lease.release()
        result = _sensor(definitions, instance)
        assert len(result.run_requests) == 1
        assert instance.get_run_by_id(live.run_id).status == dg.DagsterRunStatus.FAILURE
        assert "marked failed by slot_lag_sensor" in _failure_message(instance, live.run_id)
