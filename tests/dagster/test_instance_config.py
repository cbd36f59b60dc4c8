"""The shipped ``dagster.yaml.example`` and ``workspace.yaml``, loaded as Dagster loads them.

* The example becomes a real instance on PostgreSQL run/event/schedule storage (a database of
  its own on the test cluster, reached through the DAGSTER_PG_* variables), with the queued
  run coordinator, the run limit, telemetry off, and the ``pgcdc_slot`` pool limited to 1;
  a job whose op is in that pool runs on it, and its run and events land in PostgreSQL.
* ``workspace.yaml`` loads through Dagster's workspace loading (a code server subprocess)
  and yields the project's repository: assets, jobs, schedules, sensors.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from psycopg2 import sql

from pgcdc_dagster.assets import CAPTURE_POOL
from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
SLOT = "dg_instance"


def _dsn_parts(dsn: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in dsn.split())


@pytest.fixture
def example_instance(pg_server: str, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dg.DagsterInstance, str]]:
    """The example file, copied into a fresh DAGSTER_HOME, storage in a new database."""
    db = f"dagster_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(pg_server)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    parts = _dsn_parts(pg_server)
    monkeypatch.setenv("DAGSTER_PG_HOST", parts.get("host", "127.0.0.1"))
    monkeypatch.setenv("DAGSTER_PG_PORT", parts.get("port", "5432"))
    monkeypatch.setenv("DAGSTER_PG_USER", parts.get("user", "postgres"))
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", parts.get("password", ""))
    monkeypatch.setenv("DAGSTER_PG_DB", db)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "dagster.yaml.example", home / "dagster.yaml")
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        yield instance, " ".join([*(p for p in pg_server.split() if not p.startswith("dbname=")),
                                  f"dbname={db}"])
    finally:
        instance.dispose()
        with admin.cursor() as cur:
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(db)))
        admin.close()


def test_dagster_yaml_example_loads_as_a_postgres_instance_and_runs_a_job(
        example_instance, pg_dsn, pg_conn, lakehouse) -> None:
    """Production instance settings; one reader per slot (pool limit 1) before teardown, which
    drops the slot (STR-20: never dropped automatically, only by this confirmed job)."""
    instance, dagster_dsn = example_instance
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
    assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
    assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
    assert instance.telemetry_enabled is False
    concurrency = instance.get_concurrency_config()
    assert concurrency.run_queue_config is not None
    assert concurrency.run_queue_config.max_concurrent_runs == 4
    assert concurrency.pool_config.default_pool_limit == 1
    assert concurrency.pool_config.pool_granularity is not None
    assert concurrency.pool_config.pool_granularity.value == "op"

    # A real job of the project whose op is in the slot pool: teardown drops a real slot.
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY)")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    definitions = build_definitions([("public", "items")], {
        "postgres": PostgresResource(dsn=pg_dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables="public\\.items", slot=SLOT, publication=SLOT),
        "spark": SparkResource(),
    }, settings=MonitorSettings())
    result = definitions.resolve_job_def("teardown").execute_in_process(
        run_config={"ops": {"drop_slot_and_publication": {"config": {"confirm": SLOT}}}},
        instance=instance)
    assert result.success
    with pg_conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
        assert cur.fetchone()[0] == 0

    # The op claimed a slot of the pool, which got the default limit of 1, and released it.
    info = instance.event_log_storage.get_concurrency_info(CAPTURE_POOL)
    assert info.slot_count == 1
    assert info.active_slot_count == 0

    # The run and its events are in the PostgreSQL database, read back without Dagster.
    with psycopg2.connect(dagster_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT status FROM runs WHERE run_id = %s", (result.run_id,))
        assert cur.fetchone()[0] == "SUCCESS"
        cur.execute("SELECT count(*) FROM event_logs WHERE run_id = %s", (result.run_id,))
        assert cur.fetchone()[0] > 5
        cur.execute('SELECT "limit", using_default_limit FROM concurrency_limits '
                    "WHERE concurrency_key = %s", (CAPTURE_POOL,))
        assert cur.fetchone() == (1, True)
    conn.close()


def test_workspace_yaml_loads_the_project_definitions(pg_dsn, pg_conn,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The code location of workspace.yaml, loaded by Dagster in a code server process."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        cur.execute("CREATE TABLE tags (id int PRIMARY KEY)")
    monkeypatch.setenv("PGCDC_PG_DSN", pg_dsn)
    monkeypatch.setenv("PGCDC_TABLES", "public\\.items")
    monkeypatch.chdir(ROOT)
    with dg.instance_for_test() as instance, WorkspaceProcessContext(
            instance, WorkspaceFileTarget(paths=[str(ROOT / "workspace.yaml")])) as workspace:
        request = workspace.create_request_context()
        entries = request.get_code_location_entries()
        assert list(entries) == ["assets"]  # the repository's own code location
        name = next(iter(entries))
        assert request.get_code_location_error(name) is None
        location = request.get_code_location(name)
        (repository,) = location.get_repositories().values()
        keys = {"/".join(k.path) for k in
                (n.asset_key for n in repository.get_asset_node_snaps())}
        assert {"source/public/items", "bronze/public/items", "silver/public/items",
                "source/replication_slot", "incremental/snapshot"} <= keys
        assert not any("tags" in k for k in keys)  # only the include list's tables
        jobs = {j.name for j in repository.get_all_jobs()}
        assert {"initial_snapshot", "cdc_microbatch", "capture_checks", "incremental_snapshot",
                "teardown", "incremental_snapshot_signal"} <= jobs
        assert {s.name for s in repository.get_sensors()} >= {
            "slot_lag_sensor", "table_discovery_sensor", "signal_table_sensor"}
        assert {s.name for s in repository.get_schedules()} >= {"cdc_microbatch_schedule"}
