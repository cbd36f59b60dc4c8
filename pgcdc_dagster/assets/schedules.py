"""Schedules: the micro-batch every N minutes, and every check once a day.

Both are created STOPPED: starting capture creates a replication slot on the source, and a
slot retains WAL until it is read or dropped, so turning capture on is a deliberate act
(UI: Automation, or ``dagster schedule start cdc_microbatch_schedule``). The state then
persists in the instance.
"""

# No ``from __future__ import annotations``: Dagster reads the context annotation.

import dagster as dg

from pgcdc_dagster.assets.jobs import CaptureJobs, capture_jobs
from pgcdc_dagster.assets.naming import DEFAULT_NAMES, CaptureNames
from pgcdc_dagster.assets.run_liveness import live_run_in_flight
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.ops.settings import ENV, MonitorSettings

MICROBATCH_SCHEDULE = "cdc_microbatch_schedule"
CHECKS_SCHEDULE = "capture_checks_schedule"
MAINTENANCE_SCHEDULE = "silver_maintenance_schedule"


def _cron(value: str, env: str) -> str:
    try:  # Dagster's own validation, through its public definition API
        dg.ScheduleDefinition(name="pgcdc_cron_probe", cron_schedule=value, job_name="probe")
    except dg.DagsterInvalidDefinitionError:
        raise ConfigurationError(
            f"{env} = {value!r} is not a cron schedule; write e.g. '*/5 * * * *' (every 5 "
            "minutes)") from None
    return value


def build_schedules(jobs: CaptureJobs, settings: MonitorSettings, *,
                    names: CaptureNames = DEFAULT_NAMES) -> list[dg.ScheduleDefinition]:
    """The micro-batch and checks schedules."""
    cron = _cron(settings.microbatch_cron, ENV["microbatch_cron"])
    microbatch_schedule = names.scoped(MICROBATCH_SCHEDULE)

    @dg.schedule(
        name=microbatch_schedule, cron_schedule=cron, job=jobs.microbatch,
        required_resource_keys=names.resource_keys,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"Run cdc_microbatch on '{cron}' ({ENV['microbatch_cron']}); a tick is "
        "skipped while a cdc_microbatch, initial_snapshot or incremental_snapshot run is still "
        "queued or running. A run whose worker died (nobody holds the slot's lock, nothing "
        f"logged for {settings.dead_run_grace_s} s, {ENV['dead_run_grace_s']}) is marked failed "
        "and the tick goes on.")
    def cdc_microbatch_schedule(
            context: dg.ScheduleEvaluationContext,
            **_direct: object) -> dg.RunRequest | dg.SkipReason:
        # a direct call (schedule(context)) passes the resources as keywords too
        postgres, _, capture, _ = names.bound(context)
        running = live_run_in_flight(context.instance, postgres.dsn, capture.slot,
                                     settings.dead_run_grace_s, context.log,
                                     noticed_by=microbatch_schedule,
                                     job_names=capture_jobs(names))
        if running is not None:
            return dg.SkipReason(f"{running} is still queued or running")
        return dg.RunRequest(tags={"pgcdc/trigger": "schedule"})

    checks = dg.ScheduleDefinition(
        name=names.scoped(CHECKS_SCHEDULE), job=jobs.checks,
        cron_schedule=_cron(settings.checks_cron, ENV["checks_cron"]),
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"Run every asset check on '{settings.checks_cron}' "
        f"({ENV['checks_cron']}).")
    return [cdc_microbatch_schedule, checks]


def build_maintenance_schedule(job: dg.JobDefinition, settings: MonitorSettings, *,
                               names: CaptureNames = DEFAULT_NAMES) -> dg.ScheduleDefinition:
    """The silver_maintenance schedule (tombstone retention, upkeep), created stopped."""
    cron = _cron(settings.maintenance_cron, ENV["maintenance_cron"])
    return dg.ScheduleDefinition(
        name=names.scoped(MAINTENANCE_SCHEDULE), job=job, cron_schedule=cron,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"Run silver_maintenance on '{cron}' ({ENV['maintenance_cron']}): purge "
        "silver tombstones older than tombstone_retention_hours, compact bronze and silver, "
        "vacuum and checkpoint.")
