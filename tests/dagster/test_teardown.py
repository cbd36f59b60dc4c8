"""The teardown job: confirmation, what it drops, and that the lakehouse survives it."""

from __future__ import annotations

import dagster as dg
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.silver import live_rows
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

SLOT = "dg_teardown"


def build(dsn: str, lakehouse, **capture: object) -> dg.Definitions:
    return build_definitions([("public", "items")], {
        "postgres": PostgresResource(dsn=dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables="public\\.items", slot=SLOT, publication=SLOT,
                                   **capture),  # type: ignore[arg-type]
        "spark": SparkResource(),
    }, settings=MonitorSettings())


def teardown(definitions: dg.Definitions, instance: dg.DagsterInstance,
             confirm: str) -> dg.ExecuteInProcessResult:
    return definitions.resolve_job_def("teardown").execute_in_process(
        run_config={"ops": {"drop_slot_and_publication": {"config": {"confirm": confirm}}}},
        instance=instance, raise_on_error=False)


def state(conn) -> tuple[bool, bool]:
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
        slot = cur.fetchone()[0] == 1
        cur.execute("SELECT count(*) FROM pg_publication WHERE pubname = %s", (SLOT,))
        publication = cur.fetchone()[0] == 1
    return slot, publication


def test_teardown_refuses_without_the_slot_name(pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY)")
        cur.execute(f"CREATE PUBLICATION {SLOT} FOR TABLE items")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    definitions = build(pg_dsn, lakehouse)
    with dg.instance_for_test() as instance:
        result = teardown(definitions, instance, "pgcdc")
        assert not result.success
        failure = result.failure_data_for_node("drop_slot_and_publication")
        assert failure is not None
        assert f"set the run config 'confirm' to the slot name '{SLOT}'" in \
            str(failure.user_failure_data.description)  # type: ignore[union-attr]
    assert state(pg_conn) == (True, True)


def test_teardown_drops_slot_and_publication_and_keeps_the_lakehouse(pg_dsn, pg_conn, spark,
                                                                     lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        cur.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 50) g")
    definitions = build(pg_dsn, lakehouse)
    with dg.instance_for_test() as instance:
        assert definitions.resolve_job_def("initial_snapshot").execute_in_process(
            instance=instance).success
        assert state(pg_conn) == (True, True)
        uris = [table_uri(str(lakehouse), layer, "public", "items")
                for layer in ("bronze", "silver")]
        versions = [DeltaTable(u).version() for u in uris]

        result = teardown(definitions, instance, SLOT)
        assert result.success
        assert state(pg_conn) == (False, False)
        assert [DeltaTable(u).version() for u in uris] == versions
        assert len(DeltaTable(uris[1]).to_pyarrow_table()) == 50
        observation = [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
        meta = observation[0].event_specific_data.asset_observation.metadata  # type: ignore
        assert meta["slot_dropped"].value is True
        assert meta["publication_dropped"].value is True

        # Running it again is harmless; a new snapshot (snapshot.mode when_needed: bronze
        # holds offsets of the dropped slot) resumes capture and replaces silver.
        assert teardown(definitions, instance, SLOT).success
        with pg_conn.cursor() as cur:
            cur.execute("DELETE FROM items WHERE id > 40")
        again = build(pg_dsn, lakehouse, snapshot_mode="when_needed")
        assert again.resolve_job_def("initial_snapshot").execute_in_process(
            instance=instance).success
    assert state(pg_conn) == (True, True)
    assert live_rows(uris[1]).num_rows == 40


def test_teardown_keeps_a_publication_it_did_not_create(pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY)")
        cur.execute(f"CREATE PUBLICATION {SLOT} FOR TABLE items")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    definitions = build(pg_dsn, lakehouse, publication_autocreate_mode="disabled")
    with dg.instance_for_test() as instance:
        assert teardown(definitions, instance, SLOT).success
    assert state(pg_conn) == (False, True)
