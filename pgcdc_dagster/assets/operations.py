"""Operations: the ``teardown`` job that drops the slot and publication, after confirmation,
and the ``silver_maintenance`` job that applies the tombstone retention and keeps the Delta
tables compact (compaction, vacuum, checkpoints).

Run teardown with ``ops: {drop_slot_and_publication: {config: {confirm: "<slot name>"}}}``.
It never touches the lakehouse: bronze keeps the history and silver the last state. Capture
resumes only with a new snapshot (the initial_snapshot job: silver is replaced).
"""

# No ``from __future__ import annotations``: Dagster reads the config/resource annotations.

import time
from collections.abc import Sequence

import dagster as dg
from pydantic import Field

from pgcdc_dagster.assets.jobs import TEARDOWN, job_tags
from pgcdc_dagster.assets.naming import DEFAULT_NAMES, CaptureNames
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.tombstones import purge_tombstones
from pgcdc_dagster.names import display_name
from pgcdc_dagster.ops.teardown import check_confirmation, teardown
from pgcdc_dagster.ops.upkeep import upkeep_table


class TeardownConfig(dg.Config):
    """Run configuration of the teardown: repeat the slot name to confirm."""

    confirm: str = Field(
        description="The replication slot's name (PGCDC_SLOT), typed again to confirm that "
        "slot and publication are to be dropped.")
    keep_publication: bool = Field(
        default=False,
        description="Drop only the slot. The publication is always kept when "
        "publication.autocreate.mode is 'disabled' (it belongs to the DBA).")


def build_teardown_job(names: CaptureNames = DEFAULT_NAMES) -> dg.JobDefinition:
    """The teardown job of a capture."""

    def drop(context: dg.OpExecutionContext, config: TeardownConfig) -> None:
        postgres, _, capture, _ = names.bound(context)
        try:
            check_confirmation(capture.slot, config.confirm)
        except ConfigurationError as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        keep = config.keep_publication or capture.publication_autocreate_mode == "disabled"
        report = teardown(postgres.dsn, capture.slot, capture.publication, config.confirm,
                          drop_publication_too=not keep)
        context.log.warning(
            f"slot {report.slot!r} {'dropped' if report.slot_dropped else 'did not exist'} "
            f"(was confirmed at {report.slot_confirmed_lsn}; bronze is complete up to there); "
            f"publication {report.publication!r} "
            f"{'dropped' if report.publication_dropped else 'kept'}. The lakehouse is "
            f"untouched; run {names.scoped('initial_snapshot')} to capture again (silver is "
            "replaced).")
        context.log_event(dg.AssetObservation(asset_key=names.slot_key, metadata={
            "teardown": True,
            "slot_dropped": report.slot_dropped,
            "publication_dropped": report.publication_dropped,
            "last_confirmed_lsn": str(report.slot_confirmed_lsn),
            "retained_bytes_released": report.retained_bytes_released,
        }))

    @dg.op(name=names.scoped("drop_slot_and_publication"), pool=names.pool,
           tags={"pgcdc/operation": "teardown"},
           required_resource_keys=names.resource_keys,
           description="Drop the replication slot and the publication (after confirmation).")
    def drop_slot_and_publication(context: dg.OpExecutionContext,
                                  config: TeardownConfig) -> None:
        drop(context, config)

    @dg.job(name=names.scoped(TEARDOWN), executor_def=dg.in_process_executor,
            tags=job_tags(TEARDOWN, names),
            description="Drop the replication slot and its publication, releasing the WAL the "
            "slot retains. Needs run config confirm: <slot name>. The lakehouse is not "
            "touched.")
    def teardown_job() -> None:
        drop_slot_and_publication()

    return teardown_job


teardown_job = build_teardown_job()


MAINTENANCE = "silver_maintenance"


def build_maintenance_job(tables: Sequence[tuple[str, str]],
                          names: CaptureNames = DEFAULT_NAMES) -> dg.JobDefinition:
    """The silver_maintenance job: purge each captured table's expired silver tombstones,
    then compact, vacuum and checkpoint its bronze and silver (``ops/upkeep.py``).

    It does not touch the slot, so it is not in the slot's pool (tests/dagster/test_pool.py);
    a silver merge committing at the same moment makes one of the two Delta commits fail
    with a conflict, and a rerun of the failed one is safe (neither is half-applied).
    """
    @dg.op(name=names.scoped("purge_silver_tombstones"),
           tags={"pgcdc/operation": "tombstone_purge"}, out=dg.Out(dg.Nothing),
           required_resource_keys=names.resource_keys,
           description="Delete silver tombstones (__deleted rows) whose delete committed more "
           "than tombstone_retention_hours ago.")
    def purge_silver_tombstones(context: dg.OpExecutionContext) -> None:
        postgres, lakehouse, capture, _ = names.bound(context)
        settings = capture.settings(postgres.dsn, lakehouse.root)
        hours = capture.tombstone_retention_hours
        if hours < 0:
            raise dg.Failure(description=f"tombstone_retention_hours = {hours}: use 0 or more "
                             "(0 purges every tombstone)", allow_retries=False)
        cutoff_ms = int((time.time() - hours * 3600) * 1000)
        total = 0
        for schema, table in tables:
            uri = table_uri(lakehouse.root, "silver", schema, table)
            app_id = f"{settings.app_prefix}:silver:{schema}.{table}"
            purged = purge_tombstones(uri, cutoff_ms, app_id=app_id)
            total += purged
            if purged:  # an event for the tables it changed only
                context.log.info(f"silver {display_name(schema, table)}: {purged} "
                                 f"tombstones older than {hours} h purged")
                context.log_event(dg.AssetObservation(
                    asset_key=names.silver(schema, table),
                    metadata={"tombstones_purged": purged, "retention_hours": hours}))
        context.log.info(f"{total} tombstones purged in {len(tables)} silver tables")

    @dg.op(name=names.scoped("compact_vacuum_checkpoint"),
           tags={"pgcdc/operation": "upkeep"}, ins={"after_purge": dg.In(dg.Nothing)},
           required_resource_keys=names.resource_keys,
           description="Compact bronze and silver data files to target_file_bytes (silver "
           "kept clustered by key), vacuum files removed more than vacuum_retention_hours "
           "ago, and checkpoint the Delta logs. Safe while micro-batches run.")
    def compact_vacuum_checkpoint(context: dg.OpExecutionContext) -> None:
        postgres, lakehouse, capture, _ = names.bound(context)
        settings = capture.settings(postgres.dsn, lakehouse.root)
        if capture.vacuum_retention_hours < 1 or capture.target_file_bytes < 1024:
            raise dg.Failure(
                description=f"vacuum_retention_hours = {capture.vacuum_retention_hours}, "
                f"target_file_bytes = {capture.target_file_bytes}: use at least 1 hour (files "
                "of running micro-batches must outlive it) and 1024 bytes",
                allow_retries=False)
        rewritten = 0
        for schema, table in tables:
            for layer in upkeep_table(lakehouse.root, schema, table,
                                      app_prefix=settings.app_prefix,
                                      target_bytes=capture.target_file_bytes,
                                      retention_hours=capture.vacuum_retention_hours):
                done = layer.compaction
                rewritten += done.bytes_added
                if done.conflicts:
                    context.log.info(f"{layer.layer} {schema}.{table}: {done.conflicts} "
                                     "compaction groups lost a commit race with a "
                                     "micro-batch; they are retried next run")
                last = layer.last_compaction_ms
                context.log_event(dg.AssetObservation(
                    asset_key=names.key(layer.layer, schema, table),  # type: ignore[arg-type]
                    metadata={
                        "files": layer.files,
                        "bytes": layer.bytes,
                        "live_rows": layer.live_rows,
                        "bytes_rewritten": done.bytes_added,
                        "files_compacted": done.files_removed,
                        "files_written": done.files_added,
                        "compaction_conflicts": done.conflicts,
                        "vacuumed_files": layer.vacuumed_files,
                        "checkpoint_version": layer.checkpoint_version or 0,
                        "last_compaction": dg.MetadataValue.timestamp(last / 1000)
                        if last is not None else "never",
                        **({"note": layer.note} if layer.note else {}),
                    }))
        context.log.info(f"upkeep of {len(tables)} tables: {rewritten} bytes rewritten")

    @dg.job(name=names.scoped(MAINTENANCE), executor_def=dg.in_process_executor,
            tags=job_tags(MAINTENANCE, names),
            description="Upkeep of every captured table: apply the tombstone retention "
            "(delete silver rows whose __deleted tombstone is older than "
            "tombstone_retention_hours), then compact bronze and silver, vacuum and "
            "checkpoint their logs.")
    def silver_maintenance() -> None:
        compact_vacuum_checkpoint(purge_silver_tombstones())

    return silver_maintenance
