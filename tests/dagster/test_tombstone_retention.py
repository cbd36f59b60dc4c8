"""Tombstone retention (design.md §3 decision 4; STR- deletes): the silver_maintenance job
purges silver tombstones older than tombstone_retention_hours, keeps younger ones and every
live row, and capture goes on exactly as before (the silver app transaction survives)."""

from __future__ import annotations

import dagster as dg
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.lake.delta import committed_version
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

SLOT = "dg_tombstones"


def build(dsn: str, lakehouse, hours: int) -> dg.Definitions:
    return build_definitions([("public", "items")], {
        "postgres": PostgresResource(dsn=dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables="public\\.items", slot=SLOT, publication=SLOT,
                                   tombstone_retention_hours=hours),
        "spark": SparkResource(),
    }, settings=MonitorSettings())


def tombstones(uri: str) -> int:
    data = DeltaTable(uri).to_pyarrow_table(columns=["__deleted"])
    return int(pc.sum(data.column("__deleted")).as_py() or 0)


def observations(result: dg.ExecuteInProcessResult, name: str) -> dict[str, object]:
    """Metadata value ``name`` of each asset observation that has it, by asset path."""
    out = {}
    for event in result.all_events:
        if event.event_type_value != "ASSET_OBSERVATION":
            continue
        observation = event.event_specific_data.asset_observation
        if name in observation.metadata:
            out["/".join(observation.asset_key.path)] = observation.metadata[name].value
    return out


def purged(result: dg.ExecuteInProcessResult) -> int:
    return int(sum(observations(result, "tombstones_purged").values()))  # type: ignore[arg-type]


def test_maintenance_purges_only_expired_tombstones(pg_dsn, pg_conn, spark,
                                                    lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        cur.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 100) g")
    keep = build(pg_dsn, lakehouse, hours=168)
    assert keep.resolve_job_def("initial_snapshot").execute_in_process().success
    with pg_conn.cursor() as cur:
        cur.execute("DELETE FROM items WHERE id <= 30")
        cur.execute("UPDATE items SET name = 'changed' WHERE id > 90")
    assert keep.resolve_job_def("cdc_microbatch").execute_in_process().success
    uri = table_uri(str(lakehouse), "silver", "public", "items")
    app_id = f"pgcdc:{SLOT}:silver:public.items"
    applied = committed_version(DeltaTable(uri), app_id)
    assert applied is not None
    assert tombstones(uri) == 30

    # Deletes of a moment ago are younger than a week: nothing is purged. Upkeep compacts
    # bronze's two small files (snapshot, stream) that silver has applied, and reports.
    version = DeltaTable(uri).version()
    bronze_uri = table_uri(str(lakehouse), "bronze", "public", "items")
    bronze_offset = committed_version(DeltaTable(bronze_uri), f"pgcdc:{SLOT}:bronze:public.items")
    result = keep.resolve_job_def("silver_maintenance").execute_in_process()
    assert result.success and purged(result) == 0
    assert observations(result, "tombstones_purged") == {}  # nothing purged: no event
    assert tombstones(uri) == 30
    assert not [h for h in DeltaTable(uri).history(DeltaTable(uri).version() - version)
                if h.get("pgcdc.kind") == "tombstone_purge"]
    assert observations(result, "live_rows") == {"bronze/public/items": 140,
                                                 "silver/public/items": 70}
    assert observations(result, "files_compacted")["bronze/public/items"] == 2
    assert observations(result, "files")["bronze/public/items"] == 1
    assert set(observations(result, "last_compaction")) == {"bronze/public/items",
                                                            "silver/public/items"}
    assert committed_version(DeltaTable(bronze_uri),
                             f"pgcdc:{SLOT}:bronze:public.items") == bronze_offset

    # Retention 0: every tombstone is expired; live rows stay, the capture's offset too.
    purge = build(pg_dsn, lakehouse, hours=0)
    result = purge.resolve_job_def("silver_maintenance").execute_in_process()
    assert result.success and purged(result) == 30
    assert tombstones(uri) == 0
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 70
    assert committed_version(DeltaTable(uri), app_id) == applied
    assert_silver_equals_source(pg_conn, uri, "public", "items", ["id"])

    # The checks right after upkeep compare: bronze's compaction commit (same rows) is not a
    # change silver must apply first (it said "materialize silver first" until a micro-batch).
    assert DeltaTable(bronze_uri).version() > applied  # the compaction, after what silver applied
    checks = purge.resolve_job_def("capture_checks").execute_in_process()
    matches = [e.event_specific_data for e in checks.all_events
               if e.event_type_value == "ASSET_CHECK_EVALUATION"
               and e.event_specific_data.check_name == "matches_source"]  # type: ignore[union-attr]
    assert [(m.passed, m.description) for m in matches] == [(True, matches[0].description)]

    # Capture continues over the purged, compacted tables: a deleted key can come back,
    # others change, and no compacted bronze event is applied again (key 1..30 would return).
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO items VALUES (5, 'back')")
        cur.execute("DELETE FROM items WHERE id = 50")
    assert purge.resolve_job_def("cdc_microbatch").execute_in_process().success
    assert_silver_equals_source(pg_conn, uri, "public", "items", ["id"])
    assert tombstones(uri) == 1


def test_negative_retention_is_refused(pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY)")
    result = build(pg_dsn, lakehouse, hours=-1).resolve_job_def(
        "silver_maintenance").execute_in_process(raise_on_error=False)
    assert not result.success
    failure = result.failure_data_for_node("purge_silver_tombstones")
    assert failure is not None
    assert "use 0 or more" in str(failure.user_failure_data.description)  # type: ignore[union-attr]
