"""The micro-batch and checks schedules: interval, default status, in-flight skip."""

from __future__ import annotations

import uuid

import dagster as dg
import pytest

from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

pytestmark = [pytest.mark.dagster]

TABLES = [("public", "items")]


def definitions(settings: MonitorSettings) -> dg.Definitions:
    return build_definitions(TABLES, {
        "postgres": PostgresResource(dsn="host=127.0.0.1 dbname=unused"),
        "lakehouse": LakehouseResource(root="/nonexistent"),
        "capture": CaptureResource(),
        "spark": SparkResource(),
    }, settings=settings)


def test_microbatch_schedule_defaults_to_every_five_minutes_and_stopped() -> None:
    defs = definitions(MonitorSettings.from_env({}))
    schedule = defs.resolve_schedule_def("cdc_microbatch_schedule")
    assert schedule.cron_schedule == "*/5 * * * *"
    assert schedule.job_name == "cdc_microbatch"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    checks = defs.resolve_schedule_def("capture_checks_schedule")
    assert (checks.cron_schedule, checks.job_name) == ("0 3 * * *", "capture_checks")
    assert checks.default_status == dg.DefaultScheduleStatus.STOPPED
    for sensor in ("slot_lag_sensor", "table_discovery_sensor"):
        assert defs.resolve_sensor_def(sensor).default_status == dg.DefaultSensorStatus.STOPPED


def test_microbatch_interval_comes_from_the_environment() -> None:
    env = {"PGCDC_MICROBATCH_CRON": "*/1 * * * *", "PGCDC_CHECKS_CRON": "30 2 * * 0"}
    defs = definitions(MonitorSettings.from_env(env))
    assert defs.resolve_schedule_def("cdc_microbatch_schedule").cron_schedule == "*/1 * * * *"
    assert defs.resolve_schedule_def("capture_checks_schedule").cron_schedule == "30 2 * * 0"
    with pytest.raises(ConfigurationError, match="PGCDC_MICROBATCH_CRON = 'every 5 min'"):
        definitions(MonitorSettings.from_env({"PGCDC_MICROBATCH_CRON": "every 5 min"}))
    # PGCDC_OWNERS (QA): Dagster refused 'bob' naming the asset, not the variable.
    with pytest.raises(ConfigurationError, match="PGCDC_OWNERS: 'bob' is not an owner"):
        MonitorSettings.from_env({"PGCDC_OWNERS": "team:data, bob"})
    owners = MonitorSettings.from_env({"PGCDC_OWNERS": "team:data, ana@example.com"}).owners
    assert owners == ("team:data", "ana@example.com")
    definitions(MonitorSettings.from_env({"PGCDC_OWNERS": "team:data, ana@example.com"}))


def test_schedule_requests_a_run_unless_one_is_in_flight() -> None:
    defs = definitions(MonitorSettings())
    schedule = defs.resolve_schedule_def("cdc_microbatch_schedule")

    def tick(instance: dg.DagsterInstance) -> object:
        with dg.build_schedule_context(instance=instance, resources=defs.resources) as context:
            return schedule(context)

    with dg.instance_for_test() as instance:
        request = tick(instance)
        assert isinstance(request, dg.RunRequest)
        assert request.tags["pgcdc/trigger"] == "schedule"

        running = dg.DagsterRun(job_name="cdc_microbatch", run_id=str(uuid.uuid4()),
                                status=dg.DagsterRunStatus.STARTED)
        instance.add_run(running)
        skipped = tick(instance)
        assert isinstance(skipped, dg.SkipReason)
        assert f"cdc_microbatch run {running.run_id} is still queued or running" in \
            str(skipped.skip_message)

        # Once it has finished, the next tick runs again; a snapshot run holds it back too.
        instance.report_run_failed(running)
        assert isinstance(tick(instance),
                          dg.RunRequest)
        snapshot = dg.DagsterRun(job_name="initial_snapshot", run_id=str(uuid.uuid4()),
                                 status=dg.DagsterRunStatus.STARTED)
        instance.add_run(snapshot)
        held = tick(instance)
        assert isinstance(held, dg.SkipReason)
        assert f"initial_snapshot run {snapshot.run_id}" in str(held.skip_message)
