"""Sensors: the slot-lag sensor and the table-discovery sensor.

* ``slot_lag_sensor`` reads ``pg_replication_slots`` and launches ``cdc_microbatch`` as soon
  as the slot's lag (WAL written since its confirmed position), the WAL it retains, or the
  number of row changes it holds passes a threshold, without waiting for the schedule. The
  changes are counted only when the byte thresholds are not reached, and never on the slot
  itself (one reader per slot): on a temporary copy, with a bounded peek
  (:mod:`pgcdc_dagster.ops.pending_changes`); while the slot is active (a run reads it) the
  count is skipped. The run key is the slot's confirmed LSN, so one position launches at
  most one run: a run that fails without moving the slot is not retried by the sensor (the
  schedule, or a manual run, does). The cursor is the WAL position last seen; each time it
  moves, the slot's lag is recorded as an observation of ``source/replication_slot``
  (plotted in the UI).
* ``table_discovery_sensor`` compares the tables the include list matches now with the
  captured ones and reports new, unkeyed and vanished tables in its tick (and once in the
  log). It cannot add assets itself: the user reloads the code location.

Both are created STOPPED (see schedules.py).
"""

# No ``from __future__ import annotations``: Dagster reads the resource annotations.

import json
from collections.abc import Sequence

import dagster as dg
import psycopg2

from pgcdc_dagster.assets.jobs import CaptureJobs, capture_jobs
from pgcdc_dagster.assets.naming import DEFAULT_NAMES, CaptureNames
from pgcdc_dagster.assets.run_liveness import live_run_in_flight
from pgcdc_dagster.cdc.column_options import parse_column_options
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.ops.discovery import describe, discover
from pgcdc_dagster.ops.pending_changes import count_pending_changes
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.ops.slot_health import slot_health
from pgcdc_dagster.postgres.connection import redact
from pgcdc_dagster.postgres.privileges import explain_error
from pgcdc_dagster.resources.capture import split_list

SLOT_LAG_SENSOR = "slot_lag_sensor"
DISCOVERY_SENSOR = "table_discovery_sensor"


def lag_run_key(slot: str, confirmed: object) -> str:
    """The run key of a lag-triggered run: one per slot position."""
    return f"slot-lag:{slot}:{confirmed}"


def build_sensors(tables: Sequence[tuple[str, str]], jobs: CaptureJobs,
                  settings: MonitorSettings, *,
                  names: CaptureNames = DEFAULT_NAMES) -> list[dg.SensorDefinition]:
    """The slot-lag and table-discovery sensors."""
    lag_sensor = names.scoped(SLOT_LAG_SENSOR)

    @dg.sensor(
        name=lag_sensor, job=jobs.microbatch, minimum_interval_seconds=60,
        required_resource_keys=names.resource_keys,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Launch cdc_microbatch when the slot's lag reaches "
        f"{settings.lag_trigger_bytes} bytes (PGCDC_LAG_TRIGGER_BYTES) or its retained WAL "
        f"{settings.retained_trigger_bytes} bytes (PGCDC_RETAINED_TRIGGER_BYTES) or it holds "
        f"{settings.lag_trigger_changes} row changes (PGCDC_LAG_TRIGGER_CHANGES, counted on a "
        "temporary copy of the slot); one run per confirmed LSN.")
    def slot_lag_sensor(context: dg.SensorEvaluationContext,
                        **_direct: object) -> dg.SensorResult:
        # a direct call (sensor(context)) passes the resources as keywords too
        postgres, _, capture, _ = names.bound(context)
        health = slot_health(postgres.dsn, capture.slot)
        seen = str(health.current_lsn)
        events: list[dg.AssetObservation] = []
        if health.exists and seen != context.cursor:
            events.append(dg.AssetObservation(asset_key=names.slot_key, metadata={
                "lag_bytes": health.lag_bytes,
                "retained_bytes": health.retained_bytes,
                "wal_status": str(health.wal_status),
                "confirmed_flush_lsn": str(health.confirmed_flush_lsn),
                "current_lsn": seen,
            }))

        def skip(reason: str) -> dg.SensorResult:
            return dg.SensorResult(skip_reason=reason, cursor=seen, asset_events=events)

        if not health.exists:
            return skip(f"replication slot {capture.slot!r} does not exist: run the "
                        "initial_snapshot job (this sensor only launches micro-batches)")
        if health.wal_status == "lost":
            return skip(f"replication slot {capture.slot!r} is lost (its WAL was removed): "
                        "run teardown, then initial_snapshot")
        lag_over = health.lag_bytes >= settings.lag_trigger_bytes
        retained_over = health.retained_bytes >= settings.retained_trigger_bytes
        below = (f"lag {health.lag_bytes} bytes and retained WAL {health.retained_bytes} "
                 f"bytes are below the thresholds ({settings.lag_trigger_bytes}, "
                 f"{settings.retained_trigger_bytes})")
        pending: int | None = None
        if not (lag_over or retained_over):
            threshold = settings.lag_trigger_changes
            if threshold <= 0:
                return skip(below)
            if health.lag_bytes == 0:
                return skip(f"{below}; no WAL since the slot's confirmed position")
            if health.active:
                return skip(f"{below}; the slot is active (pid {health.active_pid}, a run is "
                            "reading it): pending changes not counted")
            upto = health.current_lsn if health.current_lsn is not None else Lsn(0)
            try:
                count = count_pending_changes(postgres.dsn, capture.slot, capture.publication,
                                              upto, threshold)
            except psycopg2.Error as exc:
                return skip(f"{below}; pending changes not counted: "
                            f"{explain_error(exc, redact).splitlines()[0]}")
            pending = count.changes
            if events:
                events[0] = dg.AssetObservation(asset_key=names.slot_key, metadata={
                    **events[0].metadata, "pending_changes": pending,
                    "pending_changes_capped": count.truncated})
            if pending < threshold:
                return skip(f"{below}; {pending} pending row changes, below {threshold}")
        running = live_run_in_flight(context.instance, postgres.dsn, capture.slot,
                                     settings.dead_run_grace_s, context.log,
                                     noticed_by=lag_sensor, job_names=capture_jobs(names))
        if running is not None:
            return skip(f"lag {health.lag_bytes} bytes, but {running} is still queued or "
                        "running")
        reason = "lag" if lag_over else "retained_wal" if retained_over else "change_count"
        tags = {"pgcdc/trigger": f"slot_lag_sensor:{reason}",
                "pgcdc/lag_bytes": str(health.lag_bytes),
                "pgcdc/retained_bytes": str(health.retained_bytes),
                "pgcdc/confirmed_flush_lsn": str(health.confirmed_flush_lsn)}
        if pending is not None:
            tags["pgcdc/pending_changes"] = str(pending)
        request = dg.RunRequest(
            run_key=lag_run_key(capture.slot, health.confirmed_flush_lsn), tags=tags)
        context.log.info(f"slot {capture.slot!r}: lag {health.lag_bytes} bytes, retained "
                         f"{health.retained_bytes} bytes"
                         + ("" if pending is None else f", {pending} pending changes")
                         + ": requesting cdc_microbatch")
        return dg.SensorResult(run_requests=[request], cursor=seen, asset_events=events)

    captured = list(tables)

    @dg.sensor(
        name=names.scoped(DISCOVERY_SENSOR), minimum_interval_seconds=300,
        required_resource_keys=names.resource_keys,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Report tables the include list (PGCDC_TABLES) matches that have no "
        "assets yet, matched tables without a primary key, and captured tables that are "
        "gone. Reload the code location to pick new tables up.")
    def table_discovery_sensor(context: dg.SensorEvaluationContext,
                               **_direct: object) -> dg.SensorResult:
        postgres, _, capture, _ = names.bound(context)
        with postgres.get_connection() as conn:
            report = discover(conn, split_list(capture.tables),
                              split_list(capture.exclude_tables), captured,
                              key_for=parse_column_options(capture.column_options()).key_for)
        state = json.dumps({"new": report.new, "unkeyed": report.unkeyed,
                            "gone": report.gone}, sort_keys=True)
        message = describe(report)
        if report.changed and state != context.cursor:
            context.log.warning(message)
        return dg.SensorResult(skip_reason=message, cursor=state)

    return [slot_lag_sensor, table_discovery_sensor]
