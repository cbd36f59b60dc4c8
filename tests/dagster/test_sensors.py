"""The slot-lag and table-discovery sensors, evaluated with build_sensor_context and cursors."""

from __future__ import annotations

import json
import uuid

import dagster as dg
import psycopg2
import psycopg2.extras
import pytest
from psycopg2 import sql

from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.ops.pending_changes import count_pending_changes, row_budget
from pgcdc_dagster.ops.settings import MonitorSettings, parse_bytes
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

SLOT = "dg_sensor"


def resources(dsn: str, lakehouse, tables: str = "public\\..*") -> dict[str, object]:
    return {
        "postgres": PostgresResource(dsn=dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables=tables, slot=SLOT, publication=SLOT),
        "spark": SparkResource(),
    }


def evaluate(definitions: dg.Definitions, name: str, instance: dg.DagsterInstance,
             cursor: str | None) -> dg.SensorResult:
    sensor = definitions.resolve_sensor_def(name)
    with dg.build_sensor_context(instance=instance, cursor=cursor,
                                 resources=definitions.resources) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def write_wal(conn, first: int) -> None:
    """Insert 1000 rows of ~200 bytes (about 250 kB of WAL) from key ``first`` on."""
    with conn.cursor() as cur:
        cur.execute("INSERT INTO items SELECT g, repeat('x', 200) FROM generate_series(%s, %s) g",
                    (first, first + 999))


def current_lsn(conn) -> str:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()::text")
        return str(cur.fetchone()[0])


def test_slot_lag_sensor_launches_one_run_per_slot_position(pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, payload text)")
    settings = MonitorSettings(lag_trigger_bytes=64 << 10, retained_trigger_bytes=1 << 40)
    definitions = build_definitions([("public", "items")], resources(pg_dsn, lakehouse),
                                    settings=settings)
    with dg.instance_for_test() as instance:
        result = evaluate(definitions, "slot_lag_sensor", instance, None)
        assert not result.run_requests
        assert "does not exist: run the initial_snapshot job" in str(result.skip_reason)
        assert result.cursor is not None

        with pg_conn.cursor() as cur:
            cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
        result = evaluate(definitions, "slot_lag_sensor", instance, result.cursor)
        assert not result.run_requests
        assert "below the thresholds" in str(result.skip_reason)

        write_wal(pg_conn, 0)  # ~250 kB of WAL, over the 64 kB trigger
        result = evaluate(definitions, "slot_lag_sensor", instance, result.cursor)
        assert len(result.run_requests) == 1
        request = result.run_requests[0]
        with pg_conn.cursor() as cur:
            cur.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                        "WHERE slot_name = %s", (SLOT,))
            confirmed = cur.fetchone()[0]
        assert request.run_key == f"slot-lag:{SLOT}:{confirmed}"
        assert request.job_name in (None, "cdc_microbatch")
        assert request.tags["pgcdc/trigger"] == "slot_lag_sensor:lag"
        assert int(request.tags["pgcdc/lag_bytes"]) >= 64 << 10
        assert result.cursor == current_lsn(pg_conn)  # cursor = the last WAL position seen
        observation = result.asset_events[0]
        assert observation.asset_key == dg.AssetKey(["source", "replication_slot"])
        assert observation.metadata["lag_bytes"].value >= 64 << 10

        # Same slot position: the same run key, so Dagster launches it only once.
        write_wal(pg_conn, 1000)
        again = evaluate(definitions, "slot_lag_sensor", instance, result.cursor)
        assert again.run_requests[0].run_key == request.run_key

        # A micro-batch is in flight: the sensor waits instead of queueing more.
        instance.add_run(dg.DagsterRun(job_name="cdc_microbatch", run_id=str(uuid.uuid4()),
                                       status=dg.DagsterRunStatus.STARTED))
        busy = evaluate(definitions, "slot_lag_sensor", instance, again.cursor)
        assert not busy.run_requests and "still queued or running" in str(busy.skip_reason)

    # The slot moved on (as after a micro-batch) and lags again: a new run key.
    with pg_conn.cursor() as cur:
        cur.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_flush_lsn())",
                    (SLOT,))
    write_wal(pg_conn, 2000)
    with dg.instance_for_test() as instance:
        moved = evaluate(definitions, "slot_lag_sensor", instance, None)
        assert moved.run_requests[0].run_key != request.run_key


def test_slot_lag_sensor_triggers_on_retained_wal(pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, payload text)")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    write_wal(pg_conn, 0)
    settings = MonitorSettings(lag_trigger_bytes=1 << 40, retained_trigger_bytes=64 << 10)
    definitions = build_definitions([("public", "items")], resources(pg_dsn, lakehouse),
                                    settings=settings)
    with dg.instance_for_test() as instance:
        result = evaluate(definitions, "slot_lag_sensor", instance, None)
    assert result.run_requests[0].tags["pgcdc/trigger"] == "slot_lag_sensor:retained_wal"


def test_table_discovery_sensor_reports_new_unkeyed_and_gone_tables(pg_dsn, pg_conn,
                                                                     lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY)")
        cur.execute("CREATE TABLE tags (id int PRIMARY KEY)")
        cur.execute("CREATE TABLE other_schema_ignored (id int PRIMARY KEY)")
    definitions = build_definitions([("public", "items"), ("public", "tags")],
                                    resources(pg_dsn, lakehouse, "public\\.(items|tags|new_.*)"),
                                    settings=MonitorSettings())
    with dg.instance_for_test() as instance:
        result = evaluate(definitions, "table_discovery_sensor", instance, None)
        assert "the captured tables match the include list" in str(result.skip_reason)
        assert json.loads(result.cursor) == {"new": [], "unkeyed": [], "gone": []}

        with pg_conn.cursor() as cur:
            cur.execute("CREATE TABLE new_orders (id int PRIMARY KEY, total numeric)")
            cur.execute("CREATE TABLE new_log (line text)")
            cur.execute("DROP TABLE tags")
        result = evaluate(definitions, "table_discovery_sensor", instance, result.cursor)
        assert not result.run_requests
        message = str(result.skip_reason)
        assert "public.new_orders" in message and "Reload the code location" in message
        assert "public.new_log" in message and "no primary key" in message
        assert "public.tags" in message and "no longer in the source" in message
        assert json.loads(result.cursor) == {"new": [["public", "new_orders"]],
                                             "unkeyed": [["public", "new_log"]],
                                             "gone": [["public", "tags"]]}
        # Nothing changed since: the same report and cursor.
        again = evaluate(definitions, "table_discovery_sensor", instance, result.cursor)
        assert again.cursor == result.cursor and str(again.skip_reason) == message


def test_monitor_settings_from_the_environment() -> None:
    settings = MonitorSettings.from_env({
        "PGCDC_MICROBATCH_CRON": "*/2 * * * *", "PGCDC_LAG_TRIGGER_BYTES": "16MB",
        "PGCDC_SLOT_MAX_RETAINED_BYTES": "2gb", "PGCDC_OWNERS": "team:data, dba@example.com"})
    assert settings.microbatch_cron == "*/2 * * * *"
    assert settings.lag_trigger_bytes == 16 << 20
    assert settings.slot.max_retained_bytes == 2 << 30
    assert settings.slot.max_lag_bytes == MonitorSettings().slot.max_lag_bytes
    assert settings.owners == ("team:data", "dba@example.com")
    assert parse_bytes("1048576", "x") == 1 << 20
    with pytest.raises(ConfigurationError, match="PGCDC_LAG_TRIGGER_BYTES = 'lots'"):
        MonitorSettings.from_env({"PGCDC_LAG_TRIGGER_BYTES": "lots"})


def slot_state(conn) -> tuple:
    """The slot's position and activity, and how many slots the database has."""
    with conn.cursor() as cur:
        cur.execute("SELECT restart_lsn::text, confirmed_flush_lsn::text, active "
                    "FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
        row = cur.fetchone()
        cur.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()")
        return (*row, cur.fetchone()[0])


def single_row_transactions(conn, first: int, count: int) -> None:
    with conn.cursor() as cur:
        for key in range(first, first + count):
            cur.execute("INSERT INTO items VALUES (%s, 'x')", (key,))


def change_count_setup(pg_dsn, pg_conn, lakehouse, threshold: int) -> dg.Definitions:
    with pg_conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, payload text)")
        cur.execute("CREATE TABLE other (id int)")
        cur.execute(f"CREATE PUBLICATION {SLOT} FOR TABLE items")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    settings = MonitorSettings(lag_trigger_bytes=1 << 40, retained_trigger_bytes=1 << 40,
                               lag_trigger_changes=threshold)
    return build_definitions([("public", "items")], resources(pg_dsn, lakehouse),
                             settings=settings)


def test_slot_lag_sensor_triggers_on_change_count_without_touching_the_slot(
        pg_dsn, pg_conn, lakehouse) -> None:
    """MON-02/MON-06: pending changes counted on a temporary copy, the slot never read;
    STR-16: confirmed_flush_lsn / restart_lsn stay where the pipeline left them."""
    definitions = change_count_setup(pg_dsn, pg_conn, lakehouse, threshold=300)
    before = slot_state(pg_conn)
    with dg.instance_for_test() as instance:
        single_row_transactions(pg_conn, 0, 100)
        with pg_conn.cursor() as cur:  # not published: not a pending change
            cur.execute("INSERT INTO other SELECT generate_series(1, 5000)")
        result = evaluate(definitions, "slot_lag_sensor", instance, None)
        assert not result.run_requests
        assert "100 pending row changes, below 300" in str(result.skip_reason)
        observation = result.asset_events[0]
        assert observation.metadata["pending_changes"].value == 100
        assert observation.metadata["pending_changes_capped"].value is False
        # The slot did not move, is not held, and the temporary copy is gone.
        assert slot_state(pg_conn) == before

        single_row_transactions(pg_conn, 100, 250)  # 350 single-row transactions in all
        result = evaluate(definitions, "slot_lag_sensor", instance, result.cursor)
        assert len(result.run_requests) == 1
        request = result.run_requests[0]
        assert request.tags["pgcdc/trigger"] == "slot_lag_sensor:change_count"
        assert int(request.tags["pgcdc/pending_changes"]) >= 300
        assert request.run_key == f"slot-lag:{SLOT}:{before[1]}"
        assert slot_state(pg_conn) == before

        # More changes at the same slot position: the same run key (launched once).
        with pg_conn.cursor() as cur:
            cur.execute("INSERT INTO items SELECT g, 'y' FROM generate_series(1000, 1999) g")
        again = evaluate(definitions, "slot_lag_sensor", instance, result.cursor)
        assert again.run_requests[0].run_key == request.run_key

    # The slot advanced past everything (as a micro-batch does): nothing pending, a new key
    # once changes pile up again.
    with pg_conn.cursor() as cur:
        cur.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_flush_lsn())",
                    (SLOT,))
    with dg.instance_for_test() as instance:
        quiet = evaluate(definitions, "slot_lag_sensor", instance, None)
        assert not quiet.run_requests
        single_row_transactions(pg_conn, 5000, 301)
        moved = evaluate(definitions, "slot_lag_sensor", instance, quiet.cursor)
        assert moved.run_requests[0].run_key != request.run_key


def test_change_count_skips_while_the_slot_is_active_and_when_off(pg_dsn, pg_conn,
                                                                  lakehouse) -> None:
    """One reader per slot: a held slot is not counted (no copy, no second reader)."""
    definitions = change_count_setup(pg_dsn, pg_conn, lakehouse, threshold=10)
    single_row_transactions(pg_conn, 0, 50)
    reader = psycopg2.connect(
        pg_dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        cur = reader.cursor()
        cur.start_replication(slot_name=SLOT, decode=False, options={
            "proto_version": "1", "publication_names": SLOT})
        with dg.instance_for_test() as instance:
            busy = evaluate(definitions, "slot_lag_sensor", instance, None)
        assert not busy.run_requests
        assert "the slot is active" in str(busy.skip_reason)
        assert "pending changes not counted" in str(busy.skip_reason)
    finally:
        reader.close()
    off = build_definitions([("public", "items")], resources(pg_dsn, lakehouse), settings=
                            MonitorSettings(lag_trigger_bytes=1 << 40,
                                            retained_trigger_bytes=1 << 40,
                                            lag_trigger_changes=0))
    with dg.instance_for_test() as instance:
        skipped = evaluate(off, "slot_lag_sensor", instance, None)
        counted = evaluate(definitions, "slot_lag_sensor", instance, None)
    assert not skipped.run_requests and "pending" not in str(skipped.skip_reason)
    assert counted.run_requests[0].tags["pgcdc/trigger"] == "slot_lag_sensor:change_count"


def test_change_count_peek_is_bounded_inside_one_large_transaction(pg_dsn, pg_conn) -> None:
    """A 60,000-row transaction is not decoded whole to count 100 changes: with streaming,
    the peek on the copy stops near its row budget (explicit upto_lsn, upto_nchanges)."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, payload text)")
        cur.execute(f"CREATE PUBLICATION {SLOT} FOR TABLE items")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
        # Sessions of this database decode with 64 kB of memory: big transactions stream.
        cur.execute("SELECT current_database()")
        cur.execute(sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'").format(
            sql.Identifier(cur.fetchone()[0])))
        cur.execute("INSERT INTO items SELECT g, repeat('z', 50) FROM generate_series(1, 60000) g")
        cur.execute("SELECT pg_current_wal_flush_lsn()::text")
        upto = Lsn.parse(cur.fetchone()[0])
    counted = count_pending_changes(pg_dsn, SLOT, SLOT, upto, threshold=100)
    assert counted.changes >= 100 and counted.truncated
    assert counted.rows < 10 * row_budget(100)  # stopped within a streamed chunk or two
    everything = count_pending_changes(pg_dsn, SLOT, SLOT, upto, threshold=100_000)
    assert everything.changes == 60000 and not everything.truncated
