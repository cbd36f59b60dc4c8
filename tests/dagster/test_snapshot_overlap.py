"""A snapshot's tables are reported as their commits are made, while Spark
reads the others; a table that fails later fails the run with its own error, and the tables
already committed stay reported and are not snapshotted again.

``snapshot.max.threads = 1`` and tables too big to share a task make the Spark tasks run one
after the other in table order, so which tables are committed before the failing one is
deterministic (no timing in the assertions: the event log's order).
"""

from __future__ import annotations

import threading

import dagster as dg
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.assets import capture_run
from pgcdc_dagster.capture import run_context, runner
from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.delta_stats import live_row_count, table_stats
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

TABLES = ("t1_first", "t2_second", "t3_bad")
ROWS = 2000


def _definitions(tables: list[tuple[str, str]], pg_dsn: str, lakehouse: object,
                 slot: str, spark_threshold_rows: int = 1_000_000) -> dg.Definitions:
    """The definitions of ``tables``, read by one snapshot thread in 1 MiB chunks (by Spark
    when ``spark_threshold_rows`` is 0)."""
    return build_definitions(tables, {
        "postgres": PostgresResource(dsn=pg_dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables=r"public\.t\d_.*", slot=slot, publication=slot,
                                   snapshot_max_threads=1, snapshot_chunk_bytes=1 << 20,
                                   snapshot_spark_threshold_rows=spark_threshold_rows),
        "spark": SparkResource(),
    }, settings=MonitorSettings())


def _mats(instance: dg.DagsterInstance, run_id: str) -> dict[str, dict]:
    """The run's materializations as its event log holds them (a failed run's too)."""
    out = {}
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        mat = entry.asset_materialization
        assert mat is not None
        out["/".join(mat.asset_key.path)] = {k: v.value for k, v in mat.metadata.items()}
    return out


def test_tables_reported_as_committed_and_a_later_failure(pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        for name in TABLES:
            cur.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, amount numeric, note text); "
                        f"INSERT INTO {name} SELECT g, g / 8.0, repeat('n', 40) "
                        f"FROM generate_series(1, {ROWS}) g; ANALYZE {name}")
        # precise decimals cannot hold NaN: the last table fails in its worker
        cur.execute("UPDATE t3_bad SET amount = 'NaN' WHERE id = 1999")
    tables = [("public", t) for t in TABLES]
    defs = _definitions(tables, pg_dsn, lakehouse, "dg_overlap")
    lake = str(lakehouse)
    with dg.instance_for_test() as instance:
        failed = defs.resolve_job_def("initial_snapshot").execute_in_process(
            instance=instance, raise_on_error=False)
        assert not failed.success
        step_error = failed.failure_data_for_node("capture").error  # type: ignore[union-attr]
        error = step_error.cause if step_error is not None else None  # the op's own error
        assert error is not None and error.cls_name == "UnsupportedTypeError"
        assert "public.t3_bad" in error.message and "decimal.handling.mode" in error.message
        # The tables committed before the failure are reported, exactly: nothing of t3_bad.
        mats = _mats(instance, failed.run_id)
        assert set(mats) == {f"{layer}/public/{t}" for layer in ("bronze", "silver")
                             for t in TABLES[:2]}
        for t in TABLES[:2]:
            bronze, silver = mats[f"bronze/public/{t}"], mats[f"silver/public/{t}"]
            assert bronze["capture_kind"] == "snapshot" and bronze["snapshot_rows"] == ROWS
            assert bronze["events_r"] == bronze["rows_written"] == ROWS
            assert bronze["dagster/row_count"] == ROWS and bronze["delta_version"] == 0
            assert silver["dagster/row_count"] == silver["rows_written"] == ROWS
            assert silver["delta_version"] == 0 and silver["capture_kind"] == "snapshot"
            # the figures the commit knew equal what the Delta logs hold
            for meta, layer in ((bronze, "bronze"), (silver, "silver")):
                stats = table_stats(table_uri(lake, layer, "public", t))
                assert (meta["files_written"], meta["bytes_written"], meta["table_bytes"]) == \
                    (stats.files, stats.bytes, stats.bytes), (t, layer)
            assert silver["dagster/row_count"] == live_row_count(
                table_uri(lake, "silver", "public", t))
            assert_silver_equals_source(pg_conn, table_uri(lake, "silver", "public", t),
                                        "public", t, ["id"])
        checks = {}
        for entry in instance.all_logs(failed.run_id,
                                       of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
            evaluation = entry.dagster_event.asset_check_evaluation_data  # type: ignore[union-attr]
            checks[(evaluation.asset_key.path[-1], evaluation.check_name)] = evaluation.passed
        assert checks == {(t, c): True for t in TABLES[:2]
                          for c in ("lsn_windows_contiguous", "schema_matches_source")}
        # Reported while the snapshot went on: t1_first's events are stored before the
        # second table's commit line.
        events = instance.all_logs(failed.run_id)
        first_mat = next(i for i, e in enumerate(events) if e.is_dagster_event and
                         e.dagster_event_type == dg.DagsterEventType.ASSET_MATERIALIZATION)
        second_commit = next(i for i, e in enumerate(events)
                             if "public.t2_second: 2,000 rows committed" in (e.message or ""))
        assert first_mat < second_commit
        assert events[first_mat].asset_materialization.asset_key.path[-1] == "t1_first"  # type: ignore[union-attr]

        with pg_conn.cursor() as cur:  # the user fixes the value; the next run finishes
            cur.execute("UPDATE t3_bad SET amount = 0 WHERE id = 1999")
        rerun = defs.resolve_job_def("cdc_microbatch").execute_in_process(instance=instance)
        assert rerun.success
        mats = _mats(instance, rerun.run_id)
        assert mats["bronze/public/t3_bad"]["snapshot_rows"] == ROWS
        assert mats["bronze/public/t3_bad"]["snapshot_resumed_chunks_total"] == 0
        # the committed tables are not snapshotted (nor reported) again
        assert not any(t in key for key in mats for t in TABLES[:2])
    for t in TABLES:
        assert_silver_equals_source(pg_conn, table_uri(lake, "silver", "public", t),
                                    "public", t, ["id"])
        bronze = DeltaTable(table_uri(lake, "bronze", "public", t)).to_pyarrow_table()
        assert bronze.num_rows == ROWS, f"{t}: each row captured exactly once"


def test_stream_after_the_snapshot_is_reported_apart(pg_dsn, pg_conn, lakehouse,
                                                     monkeypatch) -> None:
    """A change made after the slot's point reaches a snapshot table through the same run's
    stream: the table's snapshot is reported as committed (its figures without the stream's
    window, which waits for the report), then the stream's part apart. The change is made
    as the first tables are committed, and the report is held up until the stream has
    written or a while has passed: without the wait, the report would read bronze after the
    stream's window."""
    with pg_conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        for name in ("a", "b"):
            cur.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text); INSERT INTO {name} "
                        "SELECT g, 'v' || g FROM generate_series(1, 100) g")
    real = run_context.run_bronze
    changed: list[bool] = []

    def run_bronze(*args, on_committed, **kwargs):  # the change lands mid-snapshot
        def committed(part):
            if not changed:
                with pg_conn.cursor() as cur:
                    cur.execute("UPDATE a SET v = 'changed' WHERE id <= 5")
                changed.append(True)
            on_committed(part)
        return real(*args, on_committed=committed, **kwargs)

    # A slow report: the first one waits (a bounded while) for the stream to have written;
    # the stream must wait for it instead, so nothing of the window shows in the report.
    streamed = threading.Event()
    real_windows, real_health = runner.run_windows, capture_run.slot_health

    def run_windows(*args, **kwargs):
        try:
            return real_windows(*args, **kwargs)
        finally:
            streamed.set()

    def slot_health(*args, **kwargs):
        streamed.wait(2.0)
        return real_health(*args, **kwargs)

    monkeypatch.setattr(run_context, "run_bronze", run_bronze)
    monkeypatch.setattr(runner, "run_windows", run_windows)
    monkeypatch.setattr(capture_run, "slot_health", slot_health)
    defs = build_definitions([("public", "a"), ("public", "b")], {
        "postgres": PostgresResource(dsn=pg_dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables=r"public\.(a|b)", slot="dg_apart",
                                   publication="dg_apart"),
        "spark": SparkResource(),
    }, settings=MonitorSettings())
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("initial_snapshot").execute_in_process(instance=instance)
        assert result.success and changed
        mats: dict[str, list[dict]] = {}
        for entry in instance.all_logs(result.run_id,
                                       of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
            mat = entry.asset_materialization
            assert mat is not None
            mats.setdefault("/".join(mat.asset_key.path), []).append(
                {k: v.value for k, v in mat.metadata.items()})
        snap, stream = mats["bronze/public/a"]
        assert snap["capture_kind"] == "snapshot" and snap["snapshot_rows"] == 100
        assert snap["rows_written"] == snap["dagster/row_count"] == 100
        assert stream["capture_kind"] == "stream" and stream["events_u"] == 5
        assert stream["rows_written"] == 5 and stream["dagster/row_count"] == 105
        assert stream["delta_version"] == snap["delta_version"] + 1
        silver_snap, silver_stream = mats["silver/public/a"]
        assert silver_snap["capture_kind"] == "snapshot" and silver_snap["delta_version"] == 0
        assert silver_stream["capture_kind"] == "stream" and silver_stream["updated"] == 5
        assert silver_stream["bronze_version_from"] == snap["delta_version"]
        assert [m["capture_kind"] for m in mats["bronze/public/b"]] == ["snapshot"]
        assert len(mats["silver/public/b"]) == 1
        failed = [e.check_name for e in result.get_asset_check_evaluations() if not e.passed]
        assert not failed
    for name in ("a", "b"):
        assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", name),
                                    "public", name, ["id"])


def test_a_failing_report_stops_the_snapshot(pg_dsn, pg_conn, lakehouse, monkeypatch) -> None:
    """The op's thread fails while reporting the first tables (say, the event storage): the
    run fails with that error, the bronze thread stops at its next hand-over instead of
    reading on, and the next run finishes the snapshot exactly once."""
    with pg_conn.cursor() as cur:
        for name in TABLES:
            cur.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, note text); INSERT INTO "
                        f"{name} SELECT g, repeat('n', 40) FROM generate_series(1, {ROWS}) g; "
                        f"ANALYZE {name}")
    real = capture_run._Reporter.report
    calls: list[int] = []

    def report(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("event storage unavailable")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(capture_run._Reporter, "report", report)
    # Spark reads the chunks: read in this process, 2,000-row tables are all committed before
    # the failed report is seen, and nothing is left to stop.
    defs = _definitions([("public", t) for t in TABLES], pg_dsn, lakehouse, "dg_stop",
                        spark_threshold_rows=0)
    lake = str(lakehouse)
    with dg.instance_for_test() as instance:
        failed = defs.resolve_job_def("initial_snapshot").execute_in_process(
            instance=instance, raise_on_error=False)
        assert not failed.success
        error = failed.failure_data_for_node("capture").error  # type: ignore[union-attr]
        assert error is not None and error.cause is not None
        assert "event storage unavailable" in error.cause.message
        # The step stopped at its next hand-over (after the second table's commit at the
        # latest): the last table was never committed. (A table committed after the failed
        # report is not reported by this run nor the next: its events were never written.)
        assert DeltaTable(table_uri(lake, "bronze", "public", "t1_first")).version() == 0
        assert not DeltaTable.is_deltatable(table_uri(lake, "bronze", "public", "t3_bad"))
        rerun = defs.resolve_job_def("cdc_microbatch").execute_in_process(instance=instance)
        assert rerun.success
        mats = _mats(instance, rerun.run_id)
        assert "bronze/public/t3_bad" in mats and "bronze/public/t1_first" not in mats
    for t in TABLES:
        assert_silver_equals_source(pg_conn, table_uri(lake, "silver", "public", t),
                                    "public", t, ["id"])
        bronze = DeltaTable(table_uri(lake, "bronze", "public", t)).to_pyarrow_table()
        assert bronze.num_rows == ROWS, f"{t}: each row captured exactly once"
