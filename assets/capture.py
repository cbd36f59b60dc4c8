"""Bronze and silver assets, one of each per captured table.

The bronze multi-asset owns the replication slot (pool ``pgcdc_slot``, size 1): it takes the
initial snapshot when ``snapshot.mode`` asks for one and reads bounded windows. The silver
multi-asset applies what bronze appended since silver last caught up.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from pgcdc_dagster.capture.runner import BronzeRun, run_bronze, run_silver
from pgcdc_dagster.lake.delta import open_table
from resources import CaptureResource, LakehouseResource, PostgresResource, SparkResource

CAPTURE_POOL = "pgcdc_slot"
"""Concurrency pool around everything that reads the slot; give it a limit of 1."""


def source_key(schema: str, table: str) -> dg.AssetKey:
    return dg.AssetKey(["source", schema, table])


def bronze_key(schema: str, table: str) -> dg.AssetKey:
    return dg.AssetKey(["bronze", schema, table])


def silver_key(schema: str, table: str) -> dg.AssetKey:
    return dg.AssetKey(["silver", schema, table])


def source_specs(tables: Sequence[tuple[str, str]]) -> list[dg.AssetSpec]:
    """The source tables as external assets (lineage roots)."""
    return [
        dg.AssetSpec(source_key(s, t), group_name="source", kinds={"postgres"},
                     description=f"PostgreSQL table {s}.{t} (captured through the slot).")
        for s, t in tables
    ]


class BronzeConfig(dg.Config):
    """Run configuration of the bronze step."""

    snapshot_step: bool = Field(
        default=False,
        description="Check for (and take) the initial snapshot before streaming, even when "
        "the slot exists (the initial_snapshot job sets it).",
    )


def _bronze_metadata(run: BronzeRun, schema: str, table: str) -> dict[str, Any]:
    name = f"{schema}.{table}"
    meta: dict[str, Any] = {}
    kinds = []
    if run.snapshot is not None and run.snapshot.performed:
        kinds.append("snapshot")
        for t in run.snapshot.tables:
            if t.table == name:
                meta["snapshot_rows"] = t.rows
                meta["snapshot_chunks"] = t.chunks
        meta["snapshot_lsn"] = str(run.snapshot.consistent_point)
    if run.stream is not None:
        kinds.append("stream")
        ops = run.stream.events_by_table().get(name, {})
        for op in "cudt":
            meta[f"events_{op}"] = ops.get(op, 0)
        meta["lsn_start"] = str(run.stream.start)
        meta["lsn_end"] = str(run.stream.end)
        meta["windows"] = len(run.stream.windows)
        meta["slot_lag_bytes"] = run.stream.slot_lag_bytes
        meta["slot_retained_bytes"] = run.stream.slot_retained_bytes
        meta["wal_status"] = str(run.stream.wal_status)
    meta["capture_kind"] = "+".join(kinds) or "none"
    for ctx in run.contexts:
        if ctx.name == name:
            table_obj = open_table(ctx.bronze_uri)
            if table_obj is not None:
                meta["delta_version"] = table_obj.version()
            meta["table_uri"] = dg.MetadataValue.path(ctx.bronze_uri)
    return meta


def build_capture_assets(tables: Sequence[tuple[str, str]]) -> list[dg.AssetsDefinition]:
    """The bronze and silver multi-assets for the given ``(schema, table)`` pairs."""
    bronze_specs = [
        dg.AssetSpec(bronze_key(s, t), group_name="bronze", deps=[source_key(s, t)],
                     kinds={"postgres", "spark", "delta"},
                     description=f"Debezium change events of {s}.{t} (append-only Delta).")
        for s, t in tables
    ]
    silver_specs = [
        dg.AssetSpec(silver_key(s, t), group_name="silver", deps=[bronze_key(s, t)],
                     kinds={"spark", "delta"},
                     description=f"Current state of {s}.{t} (Delta; read WHERE NOT __deleted).")
        for s, t in tables
    ]

    @dg.multi_asset(specs=bronze_specs, name="bronze", pool=CAPTURE_POOL, can_subset=False)
    def bronze(context: dg.AssetExecutionContext, config: BronzeConfig,
               postgres: PostgresResource, lakehouse: LakehouseResource,
               capture: CaptureResource, spark: SparkResource,
               ) -> Iterator[dg.MaterializeResult[Any]]:
        settings = capture.settings(postgres.dsn, lakehouse.root)
        run = run_bronze(settings, spark.get_session(), force_snapshot_step=config.snapshot_step,
                         only=set(tables), progress=context.log.info)
        for note in run.notes:
            context.log.info(note)
        for s, t in tables:
            yield dg.MaterializeResult(asset_key=bronze_key(s, t),
                                       metadata=_bronze_metadata(run, s, t))

    @dg.multi_asset(specs=silver_specs, name="silver", can_subset=True)
    def silver(context: dg.AssetExecutionContext, postgres: PostgresResource,
               lakehouse: LakehouseResource, capture: CaptureResource,
               spark: SparkResource) -> Iterator[dg.MaterializeResult[Any]]:
        settings = capture.settings(postgres.dsn, lakehouse.root)
        selected = {(k.path[1], k.path[2]) for k in context.selected_asset_keys}
        for report in run_silver(settings, spark.get_session(), only=selected):
            schema, table = report.table.split(".", 1)
            counts = report.counts
            yield dg.MaterializeResult(
                asset_key=silver_key(schema, table),
                metadata={
                    "bronze_version_from": -1 if report.bronze_from is None else report.bronze_from,
                    "bronze_version_to": report.bronze_to,
                    "events": report.events,
                    "rows_merged": report.rows,
                    "inserted": counts.get("inserted", 0),
                    "updated": counts.get("updated", 0),
                    "deleted_by_truncate": counts.get("deleted_by_truncate", 0),
                    "delta_version": report.silver_version,
                    "duration_s": round(report.seconds, 3),
                },
            )

    return [bronze, silver]
