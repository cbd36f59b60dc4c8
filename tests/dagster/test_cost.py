"""Cost follows the work: runs report, check and pay for the tables they change.

One scenario over two captures of the same database, 3 and 50 tables:
* ``initial_snapshot`` of 50 tables sends the source no more statements than that of 3 (the
  catalog read in bulk) and writes four Dagster events per table (bronze and silver
  materializations, two light checks);
* an idle ``cdc_microbatch`` writes as many Dagster events for 50 captured tables as for 3
  (no per-table planned events, materializations or checks), and starts no Spark session;
* the ``capture_checks`` sweep evaluates every check of every table (all pass), opens as many
  connections and runs as many instance queries for 50 tables as for 3, writes no planned
  event and one event per check (nothing else per table), and the instance holds its results
  as the checks' latest executions; a row deleted from one silver table and a column added to
  another source table fail exactly those two checks;
* a run that changes 2 of 50 tables reports bronze and silver materializations and light
  check evaluations of exactly those 2 tables (plus the slot's check and observation);
* idle tables are not touched: with an idle table's bronze and silver Delta logs turned to
  garbage, an idle run and a run changing two other tables succeed; restored, a change to it
  lands exactly once; the same for an idle table that was added later;
* a table added later is snapshotted (with Spark) and everything converges: silver equals the
  source for the busy, idle and added tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.dagster_run import DagsterRun
from deltalake import DeltaTable

from pgcdc_dagster.assets.capture_run import _silver_may_lag
from pgcdc_dagster.assets.check_sweep import sweep_keys
from pgcdc_dagster.assets.slot_hold import SLOT_LOCK_TAG
from pgcdc_dagster.capture.snapshot import run_snapshot
from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)
from pgcdc_dagster.spark.lazy import LazySpark, local_parallelism
from pgcdc_dagster.spark.session import Opened
from tests.support.compare import assert_silver_equals_source
from tests.support.instance_reads import counting_instance_reads

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]


def _resources(dsn: str, root: str, schema: str) -> dict[str, object]:
    return {"postgres": PostgresResource(dsn=dsn), "lakehouse": LakehouseResource(root=root),
            # Snapshot chunks in Spark's workers even this small: the statements counted
            # below are the driver's (the chunks' reads are not its).
            "capture": CaptureResource(tables=f"{schema}\\..*", slot=f"dg_{schema}",
                                       publication=f"dg_{schema}",
                                       snapshot_spark_threshold_rows=0),
            "spark": SparkResource()}


def _run(defs: dg.Definitions, instance: dg.DagsterInstance,
         job: str) -> dg.ExecuteInProcessResult:
    result = defs.resolve_job_def(job).execute_in_process(instance=instance)
    assert result.success
    return result


def _materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {"/".join(e.asset_key.path) for e in result.get_asset_materialization_events()
            if e.asset_key is not None}


def _checked(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {f"{'/'.join(e.asset_key.path)}:{e.check_name}": e.passed
            for e in result.get_asset_check_evaluations()}


def _planned(instance: dg.DagsterInstance, run_id: str) -> int:
    kinds = {dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
             dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED}
    return sum(1 for r in instance.get_records_for_run(run_id, limit=10_000).records
               if r.event_log_entry.dagster_event_type in kinds)


@contextlib.contextmanager
def _counting_connections() -> Iterator[list[int]]:
    """Counts the PostgreSQL connections opened meanwhile (every one goes through
    ``psycopg2.connect``; they are real connections, only counted)."""
    count = [0]
    real = psycopg2.connect

    def counted(*args: object, **kwargs: object) -> object:
        count[0] += 1
        return real(*args, **kwargs)

    psycopg2.connect = counted
    try:
        yield count
    finally:
        psycopg2.connect = real


class _CountingCursor(psycopg2.extensions.cursor):
    """Counts the statements executed (into ``_STATEMENTS``); they run as usual."""

    def execute(self, query: object, vars: object = None) -> None:
        _STATEMENTS[0] += 1
        super().execute(query, vars)  # type: ignore[arg-type]


class _CountingConnection(psycopg2.extensions.connection):
    def cursor(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        kwargs.setdefault("cursor_factory", _CountingCursor)
        return super().cursor(*args, **kwargs)  # type: ignore[arg-type]


_STATEMENTS = [0]


@contextlib.contextmanager
def _counting_statements() -> Iterator[list[int]]:
    """Counts the statements the process sends to PostgreSQL meanwhile through ordinary
    connections (replication and custom-cursor connections are left alone): real
    statements, only counted. The Spark workers' chunk reads run in other processes."""
    real = psycopg2.connect

    def counted(*args: object, **kwargs: object) -> object:
        if "connection_factory" not in kwargs and "cursor_factory" not in kwargs:
            kwargs["connection_factory"] = _CountingConnection
        return real(*args, **kwargs)  # type: ignore[arg-type]

    _STATEMENTS[0] = 0
    psycopg2.connect = counted
    try:
        yield _STATEMENTS
    finally:
        psycopg2.connect = real


def _events_by_kind(instance: dg.DagsterInstance, run_id: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in instance.get_records_for_run(run_id, limit=100_000).records:
        kind = record.event_log_entry.dagster_event_type
        name = kind.value if kind is not None else "LOG"
        counts[name] = counts.get(name, 0) + 1
    return counts


def _corrupt_logs(root: str, schema: str, table: str, backup: Path) -> list[tuple[Path, Path]]:
    """Overwrite every file of the table's bronze and silver Delta logs with garbage (CI
    runs as root: permissions would not stop a read); returns what :func:`_restore_logs`
    puts back."""
    saved = []
    for layer in ("bronze", "silver"):
        log = Path(table_uri(root, layer, schema, table)) / "_delta_log"
        copy = backup / layer
        shutil.copytree(log, copy)
        for f in log.iterdir():
            if f.is_file():
                f.write_text("not a delta log entry")
        saved.append((copy, log))
    return saved


def _restore_logs(saved: list[tuple[Path, Path]]) -> None:
    for copy, log in saved:
        shutil.rmtree(log)
        shutil.copytree(copy, log)


def test_local_parallelism_is_known_without_a_jvm() -> None:
    assert [local_parallelism(m) for m in ("local", "local[3]", "local[2, 4]",
                                           "spark://h:7077")] == [1, 3, 2, None]
    handle = LazySpark(lambda: pytest.fail("no session may be built"), "local[4]")
    assert handle.parallelism() == 4 and not handle.created


def test_runs_pay_for_the_tables_they_change(pg_dsn, pg_conn, spark, tmp_path) -> None:
    sizes = {"cost_a": 3, "cost_b": 50}
    with pg_conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        for schema, n in sizes.items():
            cur.execute(f"CREATE SCHEMA {schema}")
            for i in range(n):
                cur.execute(f"CREATE TABLE {schema}.t{i} (id int PRIMARY KEY, v text)")
                cur.execute(f"INSERT INTO {schema}.t{i} SELECT g, 'v' || g "
                            "FROM generate_series(1, 5) g")
    events: dict[str, int] = {}
    snap_events: dict[str, dict[str, int]] = {}
    statements: dict[str, int] = {}
    with dg.instance_for_test() as inst_a, dg.instance_for_test() as inst_b:
        instances = {"cost_a": inst_a, "cost_b": inst_b}
        defs = {}
        for schema, n in sizes.items():
            root = str(tmp_path / schema)
            tables = [(schema, f"t{i}") for i in range(n)]
            defs[schema] = build_definitions(tables, _resources(pg_dsn, root, schema),
                                             settings=MonitorSettings())
            with _counting_statements() as sent:
                snap = _run(defs[schema], instances[schema], "initial_snapshot")
            statements[schema] = sent[0]
            snap_events[schema] = _events_by_kind(instances[schema], snap.run_id)
            assert _materialized(snap) == {f"{layer}/{s}/{t}" for s, t in tables
                                           for layer in ("bronze", "silver")}
            assert _planned(instances[schema], snap.run_id) == 0
            idle = _run(defs[schema], instances[schema], "cdc_microbatch")
            assert not _materialized(idle)
            assert _checked(idle) == {"source/replication_slot:slot_healthy": True}
            events[schema] = len(instances[schema].get_records_for_run(
                idle.run_id, limit=10_000).records)
        assert events["cost_a"] == events["cost_b"], events
        # The snapshot of 50 tables sends the source no more statements than that of 3 (the
        # catalog, sizes, keys and plans are read in bulk and the chunks by the Spark
        # workers; a query per table would add 47): the few that differ belong to the
        # stream step after it (a slot advance when WAL is pending). It writes four Dagster
        # events per table, its bronze and silver materializations and its two light
        # checks; the run's other events do not follow the tables (log lines come per
        # batch of commits: far fewer than one per four tables).
        assert statements["cost_b"] <= statements["cost_a"] + 10, statements
        extra = {kind: snap_events["cost_b"].get(kind, 0) - snap_events["cost_a"].get(kind, 0)
                 for kind in {*snap_events["cost_a"], *snap_events["cost_b"]}}
        assert extra.pop("ASSET_MATERIALIZATION") == 2 * (50 - 3), snap_events
        assert extra.pop("ASSET_CHECK_EVALUATION") == 2 * (50 - 3), snap_events
        assert sum(extra.values()) < (50 - 3) // 4, snap_events

        # The full check sweep: every check of every table evaluates and passes (silver
        # equals the source), and the sweep opens as many connections for 50 tables as for
        # 3 (one slot lock, one source snapshot and peek, one catalog read for all) and asks
        # the instance as many queries (the runs' LSN ranges of all tables at once). Its
        # events: no planned event, one evaluation per check, nothing else per table.
        opened: dict[str, int] = {}
        reads: dict[str, int] = {}
        sweeps: dict[str, dg.ExecuteInProcessResult] = {}
        for schema, n in sizes.items():
            with _counting_connections() as count, counting_instance_reads() as selects:
                sweep = sweeps[schema] = _run(defs[schema], instances[schema],
                                              "capture_checks")
            opened[schema], reads[schema] = count[0], selects[0]
            checked = _checked(sweep)
            assert len(checked) == 3 * n + 1 and all(checked.values()), checked
            assert _planned(instances[schema], sweep.run_id) == 0
            events[f"sweep {schema}"] = len(instances[schema].get_records_for_run(
                sweep.run_id, limit=10_000).records)
        assert opened["cost_a"] == opened["cost_b"], opened
        assert reads["cost_a"] == reads["cost_b"], reads
        assert events["sweep cost_b"] - events["sweep cost_a"] == 3 * (50 - 3), events
        # The instance holds them as the checks' latest executions (the UI's Checks tab).
        keys = sweep_keys([("cost_b", f"t{i}") for i in range(50)])
        latest = inst_b.event_log_storage.get_latest_asset_check_execution_by_key(keys)
        assert {k: (r.run_id, r.status) for k, r in latest.items()} == {
            k: (sweeps["cost_b"].run_id, AssetCheckExecutionRecordStatus.SUCCEEDED)
            for k in keys}

        # Diverged by hand: a row deleted from t5's silver, a column added to t6 at the
        # source. Exactly those two checks fail, with what differs.
        root_b = str(tmp_path / "cost_b")
        DeltaTable(table_uri(root_b, "silver", "cost_b", "t5")).delete("id = 2")
        with pg_conn.cursor() as cur:
            cur.execute("ALTER TABLE cost_b.t6 ADD COLUMN extra int")
        diverged = _run(defs["cost_b"], inst_b, "capture_checks")
        found = {f"{'/'.join(e.asset_key.path)}:{e.check_name}": e
                 for e in diverged.get_asset_check_evaluations()}
        assert len(found) == 3 * 50 + 1
        assert {k for k, e in found.items() if not e.passed} == {
            "silver/cost_b/t5:matches_source", "silver/cost_b/t6:schema_matches_source"}
        lost = found["silver/cost_b/t5:matches_source"]
        assert lost.severity == dg.AssetCheckSeverity.ERROR
        assert lost.metadata["missing_in_silver"].value == "(2,)"
        assert (lost.metadata["source_rows"].value, lost.metadata["silver_rows"].value) == (5, 4)
        added = found["silver/cost_b/t6:schema_matches_source"]
        assert added.severity == dg.AssetCheckSeverity.WARN
        assert added.metadata["added"].value == "extra"
        failed = inst_b.event_log_storage.get_latest_asset_check_execution_by_key(
            [dg.AssetCheckKey(dg.AssetKey(["silver", "cost_b", "t5"]), "matches_source")])
        assert [r.status for r in failed.values()] == [AssetCheckExecutionRecordStatus.FAILED]

        # Idle tables are not touched (no Delta log opened): t30's bronze and silver logs
        # are unreadable during an idle run and a busy run of two other tables.
        saved = _corrupt_logs(root_b, "cost_b", "t30", tmp_path / "saved")
        _run(defs["cost_b"], inst_b, "cdc_microbatch")

        # Busy: t1 and t7 change; the other 48 stay idle.
        with pg_conn.cursor() as cur:
            cur.execute("UPDATE cost_b.t1 SET v = 'changed' WHERE id <= 3")
            cur.execute("INSERT INTO cost_b.t7 VALUES (100, 'new')")
            cur.execute("DELETE FROM cost_b.t7 WHERE id = 1")
        busy = _run(defs["cost_b"], inst_b, "cdc_microbatch")
        changed = {"cost_b/t1", "cost_b/t7"}
        assert _materialized(busy) == {f"{layer}/{t}" for t in changed
                                       for layer in ("bronze", "silver")}
        assert _checked(busy) == {"source/replication_slot:slot_healthy": True,
                                  **{f"bronze/{t}:lsn_windows_contiguous": True
                                     for t in changed},
                                  **{f"silver/{t}:schema_matches_source": True
                                     for t in changed}}
        history = inst_b.fetch_materializations(dg.AssetKey(["silver", "cost_b", "t7"]),
                                                limit=5).records
        assert history[0].run_id == busy.run_id  # in the asset's history (and its plots)
        meta = history[0].asset_materialization.metadata  # type: ignore[union-attr]
        assert meta["events"].value == 2 and meta["capture_kind"].value == "stream"

        # t30's logs back, then a change to it lands once (5 snapshot rows, 1 insert).
        _restore_logs(saved)
        with pg_conn.cursor() as cur:
            cur.execute("INSERT INTO cost_b.t30 VALUES (6, 'late row')")
        woke = _run(defs["cost_b"], inst_b, "cdc_microbatch")
        assert _materialized(woke) == {"bronze/cost_b/t30", "silver/cost_b/t30"}
        assert DeltaTable(table_uri(root_b, "bronze", "cost_b", "t30")).to_pyarrow_table(
            ).num_rows == 6

        # The snapshot step with nothing to snapshot starts no Spark session.
        settings = CaptureResource(tables="cost_b\\..*", slot="dg_cost_b",
                                   publication="dg_cost_b").settings(
            pg_dsn, str(tmp_path / "cost_b"))
        idle_handle = LazySpark(lambda: Opened(spark, owned=False, kind="given"))
        assert not run_snapshot(settings, idle_handle, force=False).performed
        assert not idle_handle.created

        # A table joins later (code location reloaded): the next run snapshots and reports it.
        with pg_conn.cursor() as cur:
            cur.execute("CREATE TABLE cost_b.late (id int PRIMARY KEY, v text)")
            cur.execute("INSERT INTO cost_b.late SELECT g, 'l' || g "
                        "FROM generate_series(1, 30) g")
            cur.execute("UPDATE cost_b.t2 SET v = 'x'")
        tables = [("cost_b", f"t{i}") for i in range(50)] + [("cost_b", "late")]
        later = build_definitions(tables, _resources(pg_dsn, str(tmp_path / "cost_b"),
                                                     "cost_b"), settings=MonitorSettings())
        added = _run(later, inst_b, "cdc_microbatch")
        assert _materialized(added) == {"bronze/cost_b/late", "silver/cost_b/late",
                                        "bronze/cost_b/t2", "silver/cost_b/t2"}
        assert all(_checked(added).values()), _checked(added)
        # Idle, the table added later is not touched either (its first window's capture set
        # is not the first one: the stale-offset check does not open it).
        saved = _corrupt_logs(root_b, "cost_b", "late", tmp_path / "saved_late")
        assert not _materialized(_run(later, inst_b, "cdc_microbatch"))
        _restore_logs(saved)

    # A snapshot with chunks to read does start the session.
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE cost_b.later (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO cost_b.later VALUES (1, 'a'), (2, 'b')")
    # (Above the snapshot's Spark threshold: 0 here; below it, no Spark either.)
    busy_handle = LazySpark(lambda: Opened(spark, owned=False, kind="given"))
    busy = dataclasses.replace(settings, snapshot_spark_threshold_rows=0)
    assert run_snapshot(busy, busy_handle, force=False).rows == 2
    assert busy_handle.created
    for table in ("t0", "t1", "t2", "t7", "t30", "t49", "late", "later"):
        uri = table_uri(str(tmp_path / "cost_b"), "silver", "cost_b", table)
        assert_silver_equals_source(pg_conn, uri, "cost_b", table, ["id"])


def test_silver_sweep_follows_the_last_run_that_wrote_bronze() -> None:
    """Every silver catches up once unless the last bronze-writing run was a lean capture
    run that succeeded (run records in a real instance; the run being decided is skipped)."""
    ok, failed = dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE
    with dg.instance_for_test() as instance:
        def add(job: str, status: dg.DagsterRunStatus, tags: dict[str, str]) -> str:
            run = DagsterRun(job_name=job, status=status, tags=tags)
            instance.add_run(run)
            return run.run_id

        assert _silver_may_lag(instance, "current")  # no run yet
        add("cdc_microbatch", ok, {"pgcdc/job": "cdc_microbatch"})
        current = add("cdc_microbatch", dg.DagsterRunStatus.STARTED,
                      {"pgcdc/job": "cdc_microbatch"})
        add("capture_checks", failed, {"pgcdc/job": "capture_checks"})  # writes no bronze
        assert not _silver_may_lag(instance, current)
        add("cdc_microbatch", failed, {"pgcdc/job": "cdc_microbatch"})
        assert _silver_may_lag(instance, current)
        add("initial_snapshot", ok, {"pgcdc/job": "initial_snapshot"})
        assert not _silver_may_lag(instance, current)
        add("__ASSET_JOB", ok, {SLOT_LOCK_TAG: "1234"})  # a UI materialization of bronze
        assert _silver_may_lag(instance, current)
        add("cdc_microbatch", ok, {"pgcdc/job": "cdc_microbatch"})
        add("incremental_snapshot", ok, {"pgcdc/job": "incremental_snapshot"})
        assert _silver_may_lag(instance, current)
