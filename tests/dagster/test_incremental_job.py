"""The incremental_snapshot job and the signal-table sensor.

Real PostgreSQL, Spark and Delta; Dagster runs in process on a test instance. Seed inventory:
INC-19 (signalling table id/type/data), INC-22 (``source.snapshot = incremental``), and the
DBLog window (INC- items) exercised through the Dagster surface.
"""

from __future__ import annotations

import dagster as dg
import pyarrow.compute as pc
import pytest
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)
from deltalake import DeltaTable

from pgcdc_dagster.assets.incremental import INCREMENTAL_KEY, MAX_PARTITIONS_PER_RUN
from pgcdc_dagster.assets.partitions import INCREMENTAL_PARTITIONS, partition_key, partition_table
from pgcdc_dagster.assets.signals import SIGNAL_SENSOR, SignalCursor
from pgcdc_dagster.capture import incremental
from pgcdc_dagster.cdc.dblog import parse_signal
from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.postgres.signals import create_signal_table
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

TABLES = [("public", "items"), ("public", "tags")]
SETUP = """
CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8,2));
CREATE TABLE tags (item_id int, tag text, weight bigint, PRIMARY KEY (item_id, tag));
INSERT INTO items SELECT g, 'item ' || g, g * 0.5 FROM generate_series(1, 200) g;
INSERT INTO tags SELECT g, 't' || (g % 5), g FROM generate_series(1, 100) g;
"""
KEYS = {"items": ["id"], "tags": ["item_id", "tag"]}


@pytest.fixture
def capture(pg_dsn, pg_conn, spark, lakehouse):
    with pg_conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute(SETUP)
    definitions = build_definitions(TABLES, {
        "postgres": PostgresResource(dsn=pg_dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables=r"public\.(items|tags)", slot="dg_inc",
                                   publication="dg_inc", incremental_snapshot_chunk_size=64,
                                   signal_data_collection="public.dbz_signal"),
        "spark": SparkResource(),
    }, settings=MonitorSettings())
    with dg.instance_for_test() as instance:
        result = definitions.resolve_job_def("initial_snapshot").execute_in_process(
            instance=instance)
        assert result.success
        yield definitions, instance, str(lakehouse)


def _silver_uri(lakehouse: str, table: str) -> str:
    return table_uri(lakehouse, "silver", "public", table)


def _check_silver(pg_conn, lakehouse: str) -> None:
    for table, key in KEYS.items():
        assert_silver_equals_source(pg_conn, _silver_uri(lakehouse, table), "public", table, key)


def _partition_mats(instance: dg.DagsterInstance) -> dict[str, dict]:
    out = {}
    for record in instance.fetch_materializations(INCREMENTAL_KEY, limit=100).records:
        mat = record.asset_materialization
        assert mat is not None and mat.partition is not None
        out.setdefault(mat.partition, {k: v.value for k, v in mat.metadata.items()})
    return out


def _incremental_rows(lakehouse: str, table: str) -> list[dict]:
    data = DeltaTable(table_uri(lakehouse, "bronze", "public", table)).to_pyarrow_table(
        columns=["op", "source", "after"])
    snap = pc.struct_field(data["source"], "snapshot").to_pylist()
    return [row["after"] for row, op, s in zip(data.to_pylist(), data["op"].to_pylist(), snap,
                                                  strict=True) if op == "r" and s == "incremental"]


def test_partition_keys_round_trip() -> None:
    for name in (("public", "items"), ("my.schema", 'odd"name'), ("s", "t.u")):
        assert partition_table(partition_key(*name)) == name


def test_backfill_of_two_partitions_repairs_silver(capture, pg_conn, monkeypatch) -> None:
    """A ranged run over both tables (as a multi-run backfill launches it): silver, damaged
    by hand, equals the source afterwards although rows change inside the chunk windows;
    every partition gets its own progress metadata; the LSN-window check still passes."""
    definitions, instance, lakehouse = capture
    assert instance.get_dynamic_partitions(INCREMENTAL_PARTITIONS.name or "") == [
        "public.items", "public.tags"]  # added by the initial snapshot's bronze step
    job = definitions.resolve_job_def("incremental_snapshot")
    asset = definitions.resolve_assets_def(INCREMENTAL_KEY)
    assert asset.backfill_policy == dg.BackfillPolicy.multi_run(MAX_PARTITIONS_PER_RUN)
    assert asset.op.pool == "pgcdc_slot"  # one pool with the micro-batch and the snapshot
    # Damage silver: rows lost (as after a bad manual fix); only a re-snapshot restores them.
    silver = DeltaTable(_silver_uri(lakehouse, "items"))
    silver.delete("id > 150")
    DeltaTable(_silver_uri(lakehouse, "tags")).delete("item_id <= 20")

    real = incremental.read_chunk
    calls = [0]

    def racing_read(dsn, spec, after, upto, limit):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if spec.table == "items" and calls[0] == 2:
            with pg_conn.cursor() as cur:  # inside the second chunk's window
                cur.execute("UPDATE items SET price = -1 WHERE id BETWEEN 60 AND 70")
                cur.execute("DELETE FROM items WHERE id = 100")
        out = real(dsn, spec, after, upto, limit)
        if spec.table == "items" and calls[0] == 2:
            with pg_conn.cursor() as cur:  # after the read: the chunk's rows are stale
                cur.execute("UPDATE items SET name = 'late' WHERE id BETWEEN 80 AND 90")
        return out

    monkeypatch.setattr(incremental, "read_chunk", racing_read)
    result = job.execute_in_process(instance=instance, tags={
        ASSET_PARTITION_RANGE_START_TAG: "public.items",
        ASSET_PARTITION_RANGE_END_TAG: "public.tags"})
    assert result.success
    _check_silver(pg_conn, lakehouse)
    mats = _partition_mats(instance)
    assert set(mats) == {"public.items", "public.tags"}
    items, tags = mats["public.items"], mats["public.tags"]
    assert items["status"] == "done" and items["chunks_done"] == 4  # 64+64+64+8 rows
    assert items["chunks_total"] == 4 and items["progress"] == "4/4 chunks"
    assert items["rows_read"] == 199 and items["rows_superseded"] >= 11
    assert items["rows_emitted"] == items["rows_read"] - items["rows_superseded"]
    assert tags["chunks_done"] == 2 and tags["rows_emitted"] == 100
    assert items["rows_per_s"] > 0 and "lsn_end" in items
    assert len(_incremental_rows(lakehouse, "items")) == items["rows_emitted"]
    # The run read the slot: its bronze materializations keep the LSN chain, and the next
    # micro-batch's window check (and the silver check) pass.
    bronze = {tuple(e.asset_key.path): e for e in
              (ev.event_specific_data.materialization  # type: ignore[union-attr]
               for ev in result.get_asset_materialization_events())}
    assert bronze[("bronze", "public", "items")].metadata["capture_kind"].value == \
        "incremental+stream"
    assert bronze[("bronze", "_pgcdc", "messages")].metadata["events"].value == 0  # no
    # watermark reaches the messages table
    after = definitions.resolve_job_def("cdc_microbatch").execute_in_process(instance=instance)
    assert after.success
    failed = {e.check_name: e.description for e in after.get_asset_check_evaluations()
              if not e.passed}
    assert not failed, failed


def test_failed_partition_is_retried_and_resumes(capture, pg_conn) -> None:
    """A run whose table is paused fails that partition only; after resume-snapshot a retry
    continues from the first chunk not committed (no chunk read twice)."""
    definitions, instance, lakehouse = capture
    job = definitions.resolve_job_def("incremental_snapshot")
    signal = definitions.resolve_job_def("incremental_snapshot_signal")

    def send(kind: str, data: str = "") -> None:
        res = signal.execute_in_process(instance=instance, run_config={"ops": {
            "apply_incremental_signal": {"config": {"type": kind, "data": data}}}})
        assert res.success

    # Start items; while its second chunk is read, a pause-snapshot signal arrives (applied
    # directly: a Dagster run cannot be nested in a step).
    settings = definitions.resources["capture"].settings(  # type: ignore[attr-defined]
        definitions.resources["postgres"].dsn, lakehouse)  # type: ignore[attr-defined]
    real = incremental.read_chunk
    reads: list[list[str | None] | None] = []

    def pausing_read(dsn, spec, after, upto, limit):  # type: ignore[no-untyped-def]
        reads.append(None if after is None else list(after))
        if len(reads) == 2:
            incremental.apply_signal(settings, parse_signal("p1", "pause-snapshot", None))
        return real(dsn, spec, after, upto, limit)

    incremental.read_chunk = pausing_read  # type: ignore[assignment]
    try:
        failed = job.execute_in_process(instance=instance, partition_key="public.items",
                                        raise_on_error=False)
    finally:
        incremental.read_chunk = real  # type: ignore[assignment]
    assert not failed.success
    errors = [str(e.event_specific_data.error) for e in failed.all_events  # type: ignore[union-attr]
              if e.is_step_failure]
    assert any("public.items is paused" in e for e in errors), errors
    assert "public.items" not in _partition_mats(instance)
    send("resume-snapshot")
    seen = len(reads)
    incremental.read_chunk = pausing_read  # type: ignore[assignment]
    try:
        retried = job.execute_in_process(instance=instance, partition_key="public.items")
    finally:
        incremental.read_chunk = real  # type: ignore[assignment]
    assert retried.success
    resumed_from = reads[seen]
    assert resumed_from is not None and int(resumed_from[0]) >= 64  # not from the start
    items = _partition_mats(instance)["public.items"]
    assert items["status"] == "done" and items["chunks_done"] == 4
    assert sorted(r["id"] for r in _incremental_rows(lakehouse, "items")) == list(range(1, 201))
    _check_silver(pg_conn, lakehouse)


def _tick(definitions: dg.Definitions, instance: dg.DagsterInstance,
          cursor: str | None) -> dg.SensorResult:
    sensor = definitions.resolve_sensor_def(SIGNAL_SENSOR)
    with dg.build_sensor_context(instance=instance, cursor=cursor,
                                 resources=definitions.resources) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def test_signal_table_sensor(capture, pg_conn) -> None:
    """Signalling-table rows become runs (run key = signal id); malformed and malicious ones
    are reported and skipped; the cursor remembers what was applied."""
    definitions, instance, lakehouse = capture
    create_signal_table(pg_conn, "public.dbz_signal")
    with pg_conn.cursor() as cur:
        cur.execute("""INSERT INTO dbz_signal VALUES
            ('bad-json', 'execute-snapshot', '{"data-collections": '),
            ('evil', 'execute-snapshot', '{"data-collections": ["public.items"],
              "additional-conditions": [{"data-collection": "public.items",
                                         "filter": "id > 0; DROP TABLE items"}]}'),
            ('hello', 'log', '{"message": "hi"}')""")
    first = _tick(definitions, instance, None)
    assert not first.run_requests
    reason = first.skip_reason.skip_message if first.skip_reason else ""
    assert "'bad-json' (execute-snapshot) refused" in str(reason) and "not JSON" in str(reason)
    assert "'evil' (execute-snapshot) refused" in str(reason)
    assert "';' is not allowed" in str(reason) and "logged: hi" in str(reason)
    cursor = SignalCursor.parse(first.cursor)
    assert cursor.seen == ["bad-json", "evil", "hello"] and cursor.last == "hello"

    with pg_conn.cursor() as cur:
        cur.execute("""INSERT INTO dbz_signal VALUES ('ad-hoc-7', 'execute-snapshot',
            '{"data-collections": ["public\\\\.(items|tags)"], "additional-conditions":
              [{"data-collection": "public.items", "filter": "id <= 100"}]}')""")
    second = _tick(definitions, instance, first.cursor)
    requests = {r.partition_key: r for r in second.run_requests}
    assert set(requests) == {"public.items", "public.tags"}
    assert requests["public.items"].run_key == "ad-hoc-7:public.items"
    assert requests["public.items"].tags["pgcdc/signal_id"] == "ad-hoc-7"
    assert not _tick(definitions, instance, second.cursor).run_requests  # nothing new

    job = definitions.resolve_job_def("incremental_snapshot")
    req = requests["public.items"]
    result = job.execute_in_process(instance=instance, partition_key=req.partition_key,
                                    tags=req.tags)
    assert result.success
    items = _partition_mats(instance)["public.items"]
    assert items["signal_id"] == "ad-hoc-7" and items["additional_condition"] == \
        '("id" OPERATOR(pg_catalog.<=) 100)'
    assert sorted(r["id"] for r in _incremental_rows(lakehouse, "items")) == list(range(1, 101))

    # A single-table signal: run key = the signal id itself.
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO dbz_signal VALUES ('again', 'execute-snapshot', "
                    "'{\"data-collections\": [\"public.tags\"]}')")
    third = _tick(definitions, instance, second.cursor)
    assert [(r.run_key, r.partition_key) for r in third.run_requests] == [("again",
                                                                           "public.tags")]


def test_settings_from_the_environment(monkeypatch) -> None:
    """PGCDC_INCREMENTAL_CHUNK_SIZE and PGCDC_SIGNAL_DATA_COLLECTION reach the engine."""
    from pgcdc_dagster.capture.incremental import DEFAULT_CHUNK_SIZE
    from pgcdc_dagster.definitions import default_resources

    monkeypatch.setenv("PGCDC_PG_DSN", "host=127.0.0.1 dbname=x")
    with dg.build_resources({"capture": default_resources()["capture"]}) as res:
        plain = res.capture.settings("dsn", "/tmp/lake")
    assert plain.incremental_chunk_size == DEFAULT_CHUNK_SIZE == 65536
    assert plain.signal_data_collection == ""
    monkeypatch.setenv("PGCDC_INCREMENTAL_CHUNK_SIZE", "4096")
    monkeypatch.setenv("PGCDC_SIGNAL_DATA_COLLECTION", "ops.dbz_signal")
    with dg.build_resources({"capture": default_resources()["capture"]}) as res:
        settings = res.capture.settings("dsn", "/tmp/lake")
    assert settings.incremental_chunk_size == 4096
    assert settings.signal_data_collection == "ops.dbz_signal"
