"""A run worker killed in a capture step leaves its ``pgcdc_slot`` pool slot claimed; once
Dagster has failed the run (run monitoring's health check does within seconds), the next
schedule tick frees that slot and requests the micro-batch, instead of the next run waiting
for the pool until ``free_slots_after_run_end_seconds``. A live run keeps its slot; the
shipped instance settings free such slots within seconds too."""

from __future__ import annotations

import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml

from pgcdc_dagster.assets import CAPTURE_POOL
from pgcdc_dagster.ops.settings import MonitorSettings
from tests.dagster.test_schedules import definitions

pytestmark = [pytest.mark.dagster]

EXAMPLE = Path(__file__).resolve().parents[2] / "dagster.yaml.example"


def _claimed(instance: dg.DagsterInstance) -> set[str]:
    info = instance.event_log_storage.get_concurrency_info(CAPTURE_POOL)
    return {slot.run_id for slot in info.claimed_slots}


def test_a_killed_runs_pool_slot_is_freed_at_the_next_tick() -> None:
    defs = definitions(MonitorSettings())
    schedule = defs.resolve_schedule_def("cdc_microbatch_schedule")
    with dg.instance_for_test() as instance:
        storage = instance.event_log_storage
        assert storage.supports_global_concurrency_limits
        storage.set_concurrency_slots(CAPTURE_POOL, 1)
        killed = dg.DagsterRun(job_name="cdc_microbatch", run_id=str(uuid.uuid4()),
                               status=dg.DagsterRunStatus.STARTED)
        instance.add_run(killed)
        assert storage.claim_concurrency_slot(CAPTURE_POOL, killed.run_id, "capture").is_claimed
        instance.report_run_failed(killed)  # what run monitoring does when the worker is gone
        assert _claimed(instance) == {killed.run_id}

        with dg.build_schedule_context(instance=instance, resources=defs.resources) as context:
            request = schedule(context)
        assert isinstance(request, dg.RunRequest)
        assert _claimed(instance) == set()

        # a run still in flight keeps its slot (and holds the tick back)
        live = dg.DagsterRun(job_name="cdc_microbatch", run_id=str(uuid.uuid4()),
                             status=dg.DagsterRunStatus.STARTED)
        instance.add_run(live)
        assert storage.claim_concurrency_slot(CAPTURE_POOL, live.run_id, "capture").is_claimed
        with dg.build_schedule_context(instance=instance, resources=defs.resources) as context:
            assert isinstance(schedule(context), dg.SkipReason)
        assert _claimed(instance) == {live.run_id}


def test_shipped_instance_settings_free_slots_within_the_grace_period() -> None:
    monitoring = yaml.safe_load(EXAMPLE.read_text())["run_monitoring"]
    grace = 20  # the smallest PGCDC_DEAD_RUN_GRACE_SECONDS reported in use
    assert monitoring["enabled"] is True
    assert monitoring["poll_interval_seconds"] + monitoring["free_slots_after_run_end_seconds"] \
        < grace
