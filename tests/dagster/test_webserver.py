"""The Dagster webserver on loopback: the asset graph, jobs, schedules, sensors and checks over
GraphQL, and a cdc_microbatch run launched through GraphQL that succeeds.

The server runs with its own DAGSTER_HOME (telemetry off, runs launched at once in a
subprocess), is started with ``env --default-signal=INT`` and stopped by its own PID with
SIGINT (its process group is killed only if it lingers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.silver import live_rows
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.postgres.local_cluster import free_port
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
SLOT = "dg_web"
DAGSTER_YAML = """\
telemetry:
  enabled: false
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
"""
READY_TIMEOUT_S = 180
RUN_TIMEOUT_S = 300

GRAPH = """
{ assetNodes { assetKey { path } groupName kinds description
    owners { ... on TeamAssetOwner { team } ... on UserAssetOwner { email } }
    assetChecksOrError { ... on AssetChecks { checks { name } } } } }
"""
REPOSITORY = """
{ repositoriesOrError { ... on RepositoryConnection { nodes {
    name location { name }
    jobs { name }
    schedules { name cronSchedule scheduleState { status } }
    sensors { name sensorState { status } } } } } }
"""
LAUNCH = """
mutation Launch($params: ExecutionParams!) { launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message stack }
    ... on RunConfigValidationInvalid { errors { message } } } }
"""
RUN = """
query Run($id: ID!) { runOrError(runId: $id) { __typename ... on Run { status } } }
"""
CHECK_EXECUTIONS = """
query Checks($key: AssetKeyInput!, $name: String!) {
  assetCheckExecutions(assetKey: $key, checkName: $name, limit: 1) { status runId } }
"""


class Server:
    """A dagster-webserver process on 127.0.0.1."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        webserver = Path(sys.executable).parent / "dagster-webserver"
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            ["env", "--default-signal=INT", str(webserver), "-m", "pgcdc_dagster.definitions",
             "-h", "127.0.0.1", "-p", str(self.port)],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "dagster-webserver exited early"
            try:
                with urllib.request.urlopen(f"{self.url}/server_info", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"dagster-webserver did not answer within {READY_TIMEOUT_S}s")

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            payload = json.loads(resp.read())
        assert "errors" not in payload, payload["errors"]
        return payload["data"]  # type: ignore[no-any-return]

    def stop(self) -> None:
        """SIGINT to the server's own PID; kill its process group only if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            pass
        else:  # children (code server) still there
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def dagster_env(pg_dsn: str, lakehouse: Path, tmp_path: Path, slot: str,
                **pgcdc: str) -> dict[str, str]:
    """The environment of a Dagster server process: a DAGSTER_HOME of its own (telemetry
    off), the documented PGCDC_* variables (``tables=...`` -> ``PGCDC_TABLES``) and Spark's."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    env = dict(os.environ)
    env.update({
        "DAGSTER_HOME": str(home), "PGCDC_PG_DSN": pg_dsn, "PGCDC_LAKEHOUSE": str(lakehouse),
        "PGCDC_SLOT": slot, "PGCDC_PUBLICATION": slot,
        "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
    })
    env.update({f"PGCDC_{name.upper()}": value for name, value in pgcdc.items()})
    return env


@pytest.fixture
def server_env(pg_dsn, lakehouse, tmp_path) -> dict[str, str]:
    return dagster_env(pg_dsn, lakehouse, tmp_path, SLOT, tables="public\\..*")


@pytest.fixture
def server(server_env, tmp_path) -> Iterator[Server]:
    srv = Server(server_env, tmp_path / "webserver.log")
    try:
        yield srv
    finally:
        srv.stop()


def test_webserver_shows_the_graph_and_runs_a_microbatch(server, pg_dsn, pg_conn, spark,
                                                         lakehouse, tmp_path) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        cur.execute("CREATE TABLE tags (id int PRIMARY KEY, tag text)")
        cur.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 100) g")
        cur.execute("INSERT INTO tags SELECT g, 't' || g FROM generate_series(1, 10) g")
    # The snapshot runs in this process (warm Spark) while the server starts.
    definitions = build_definitions([("public", "items"), ("public", "tags")], {
        "postgres": PostgresResource(dsn=pg_dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables="public\\..*", slot=SLOT, publication=SLOT),
        "spark": SparkResource(),
    }, settings=MonitorSettings())
    assert definitions.resolve_job_def("initial_snapshot").execute_in_process().success
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE items SET name = 'changed' WHERE id <= 5")
        cur.execute("DELETE FROM items WHERE id > 95")
    server.wait_ready()

    nodes = {"/".join(n["assetKey"]["path"]): n for n in server.graphql(GRAPH)["assetNodes"]}
    assert {"source/public/items", "source/replication_slot", "bronze/public/items",
            "silver/public/items", "bronze/public/tags", "silver/public/tags"} <= set(nodes)
    bronze, silver = nodes["bronze/public/items"], nodes["silver/public/items"]
    assert bronze["groupName"] == "bronze" and silver["groupName"] == "silver"
    assert set(bronze["kinds"]) == {"postgres", "spark", "delta"}
    assert bronze["owners"] == [{"team": "pgcdc"}]
    assert "Debezium" in bronze["description"]
    check_names = {c["name"] for c in silver["assetChecksOrError"]["checks"]}
    assert check_names == {"matches_source", "schema_matches_source"}
    assert {c["name"] for c in bronze["assetChecksOrError"]["checks"]} == \
        {"lsn_windows_contiguous"}
    assert {c["name"] for c in nodes["source/replication_slot"]["assetChecksOrError"][
        "checks"]} == {"slot_healthy"}

    repo = server.graphql(REPOSITORY)["repositoriesOrError"]["nodes"][0]
    assert {"initial_snapshot", "cdc_microbatch", "capture_checks", "teardown",
            "incremental_snapshot", "incremental_snapshot_signal"} <= \
        {j["name"] for j in repo["jobs"]}
    schedules = {s["name"]: s for s in repo["schedules"]}
    assert schedules["cdc_microbatch_schedule"]["cronSchedule"] == "*/5 * * * *"
    assert schedules["cdc_microbatch_schedule"]["scheduleState"]["status"] == "STOPPED"
    assert {s["name"] for s in repo["sensors"]} == {"slot_lag_sensor", "table_discovery_sensor",
                                                   "signal_table_sensor"}

    params = {"selector": {"repositoryLocationName": repo["location"]["name"],
                           "repositoryName": repo["name"], "jobName": "cdc_microbatch"},
              "runConfigData": {}}
    launched = server.graphql(LAUNCH, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    deadline = time.monotonic() + RUN_TIMEOUT_S
    status = "QUEUED"
    while status not in ("SUCCESS", "FAILURE", "CANCELED") and time.monotonic() < deadline:
        time.sleep(1)
        status = server.graphql(RUN, {"id": run_id})["runOrError"]["status"]
    assert status == "SUCCESS", (tmp_path / "webserver.log").read_text()[-5000:]

    check = server.graphql(CHECK_EXECUTIONS, {
        "key": {"path": ["bronze", "public", "items"]}, "name": "lsn_windows_contiguous"})
    assert check["assetCheckExecutions"][0] == {"status": "SUCCEEDED", "runId": run_id}
    live = live_rows(table_uri(str(lakehouse), "silver", "public", "items"))
    assert live.num_rows == 95
    changed = [i for i, n in zip(live["id"].to_pylist(), live["name"].to_pylist(), strict=True)
               if n == "changed"]
    assert sorted(changed) == [1, 2, 3, 4, 5]
