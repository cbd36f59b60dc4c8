"""A real Dagster backfill of ``incremental/snapshot`` (INC-04 on demand,
INC-13 ad hoc snapshot, launched the way the UI does).

``dagster-webserver`` and ``dagster-daemon run`` run on loopback with their own DAGSTER_HOME;
the backfill is launched over GraphQL (``launchPartitionBackfill``, the UI's mutation) for three
table partitions; the daemon's backfill loop turns it into runs by the asset's backfill policy
(``multi_run(20)``: one run for the three), the run launcher executes them in a subprocess.
Both servers start with ``env --default-signal=INT`` and stop by their own PID with SIGINT.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    BACKFILL_ID_TAG,
)
from deltalake import DeltaTable

from pgcdc_dagster.assets.incremental import INCREMENTAL_KEY
from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)
from tests.dagster.test_webserver import ROOT, Server, dagster_env
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

SLOT = "dg_backfill"
TABLES = [("public", "items"), ("public", "notes"), ("public", "tags")]
KEYS = {"items": ["id"], "notes": ["id"], "tags": ["item_id", "tag"]}
SETUP = """
CREATE TABLE items (id int PRIMARY KEY, name text);
CREATE TABLE notes (id int PRIMARY KEY, body text);
CREATE TABLE tags (item_id int, tag text, PRIMARY KEY (item_id, tag));
INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 150) g;
INSERT INTO notes SELECT g, 'b' || g FROM generate_series(1, 70) g;
INSERT INTO tags SELECT g, 't' || (g % 4) FROM generate_series(1, 90) g;
"""
BACKFILL = """
mutation Backfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack } } }
"""
STATUS = """
query Status($id: String!) { partitionBackfillOrError(backfillId: $id) {
    __typename ... on PartitionBackfill { status numPartitions } } }
"""
DONE = ("COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED")
TIMEOUT_S = 300


class Daemon:
    """``dagster-daemon run`` on the same DAGSTER_HOME and code location."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        daemon = Path(sys.executable).parent / "dagster-daemon"
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            ["env", "--default-signal=INT", str(daemon), "run", "-m",
             "pgcdc_dagster.definitions"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def stop(self) -> None:
        """SIGINT to the daemon's own PID; SIGKILL only if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def home_env(pg_dsn, lakehouse, tmp_path) -> Iterator[dict[str, str]]:
    yield dagster_env(pg_dsn, lakehouse, tmp_path, SLOT, tables=r"public\.(items|notes|tags)",
                      incremental_chunk_size="32")


def test_backfill_over_three_tables_runs_once(home_env, pg_dsn, pg_conn, spark, lakehouse,
                                              tmp_path) -> None:
    """A backfill of three partitions launched through GraphQL is executed by the daemon as
    one run (backfill policy), every partition is materialized with its progress, silver
    (damaged beforehand) equals the source again, and each source row has one incremental
    READ in bronze (INC-05, INC-22)."""
    with pg_conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute(SETUP)
    server = Server(home_env, tmp_path / "webserver.log")
    daemon: Daemon | None = None
    try:
        # The initial snapshot runs in this process (warm Spark) on the servers' instance, so
        # the dynamic partitions exist there; the webserver starts meanwhile.
        definitions = build_definitions(TABLES, {
            "postgres": PostgresResource(dsn=pg_dsn),
            "lakehouse": LakehouseResource(root=str(lakehouse)),
            "capture": CaptureResource(tables=home_env["PGCDC_TABLES"], slot=SLOT,
                                       publication=SLOT),
            "spark": SparkResource(),
        }, settings=MonitorSettings())
        instance = dg.DagsterInstance.from_config(home_env["DAGSTER_HOME"])
        assert definitions.resolve_job_def("initial_snapshot").execute_in_process(
            instance=instance).success
        DeltaTable(table_uri(str(lakehouse), "silver", "public", "items")).delete("id > 100")
        with pg_conn.cursor() as cur:
            cur.execute("UPDATE notes SET body = 'changed' WHERE id <= 10")
        server.wait_ready()
        partitions = ["public.items", "public.notes", "public.tags"]
        launched = server.graphql(BACKFILL, {"params": {
            "assetSelection": [{"path": list(INCREMENTAL_KEY.path)}],
            "partitionNames": partitions, "fromFailure": False}})["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill_id = launched["backfillId"]
        # The daemon's first backfill iteration runs at its start: it submits the runs.
        daemon = Daemon(home_env, tmp_path / "daemon.log")
        deadline = time.monotonic() + TIMEOUT_S
        status = ""
        while time.monotonic() < deadline:
            assert daemon.proc.poll() is None, (tmp_path / "daemon.log").read_text()[-3000:]
            status = server.graphql(STATUS, {"id": backfill_id})[
                "partitionBackfillOrError"]["status"]
            if status in DONE:
                break
            time.sleep(2)
        logs = (tmp_path / "daemon.log").read_text()[-4000:]
        assert status in ("COMPLETED", "COMPLETED_SUCCESS"), (status, logs)
    finally:
        if daemon is not None:
            daemon.stop()
        server.stop()

    instance = dg.DagsterInstance.from_config(home_env["DAGSTER_HOME"])
    runs = instance.get_runs(filters=dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
    assert len(runs) == 1, [r.tags for r in runs]  # multi_run(20): three partitions, one run
    run = runs[0]
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert run.tags[ASSET_PARTITION_RANGE_START_TAG] == "public.items"
    assert run.tags[ASSET_PARTITION_RANGE_END_TAG] == "public.tags"
    mats = {}
    for record in instance.fetch_materializations(INCREMENTAL_KEY, limit=20).records:
        mat = record.asset_materialization
        assert mat is not None and record.run_id == run.run_id
        mats[mat.partition] = {k: v.value for k, v in mat.metadata.items()}
    assert set(mats) == set(partitions)
    expected_chunks = {"public.items": 5, "public.notes": 3, "public.tags": 3}  # 32 per chunk
    for key, meta in mats.items():
        assert meta["status"] == "done", (key, meta)
        assert meta["chunks_done"] == expected_chunks[key], (key, meta)
        assert meta["signal_id"] == backfill_id  # the backfill is the snapshot's origin
    for table, key in KEYS.items():
        assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public",
                                                       table), "public", table, key)
    assert mats["public.items"]["rows_emitted"] == 150
