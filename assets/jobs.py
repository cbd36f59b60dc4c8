"""The capture jobs: initial snapshot, micro-batch, checks (teardown is in operations.py).

``initial_snapshot`` and ``cdc_microbatch`` materialize bronze then silver and run the
light checks (LSN windows, schema drift, slot health) after them; ``capture_checks`` runs
every check, including the full silver-against-source comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,
)

from assets.checks import light_check_keys

INITIAL_SNAPSHOT = "initial_snapshot"
MICROBATCH = "cdc_microbatch"
CAPTURE_CHECKS = "capture_checks"
TEARDOWN = "teardown"
INCREMENTAL = "incremental_snapshot"

IN_FLIGHT = (
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
)


@dataclass(frozen=True)
class CaptureJobs:
    """The asset jobs of one capture."""

    initial_snapshot: UnresolvedAssetJobDefinition
    microbatch: UnresolvedAssetJobDefinition
    checks: UnresolvedAssetJobDefinition

    def all(self) -> list[UnresolvedAssetJobDefinition]:
        return [self.initial_snapshot, self.microbatch, self.checks]


def build_jobs(tables: Sequence[tuple[str, str]]) -> CaptureJobs:
    """The capture jobs for the given tables."""
    capture = (dg.AssetSelection.groups("bronze", "silver").without_checks()
               | dg.AssetSelection.checks(*light_check_keys(tables)))
    initial_snapshot = dg.define_asset_job(
        INITIAL_SNAPSHOT, selection=capture,
        description="Create the slot, snapshot every captured table (bronze op=r and the "
        "silver baseline), then catch up with the stream.",
        config={"ops": {"bronze": {"config": {"snapshot_step": True}}}},
        executor_def=dg.in_process_executor,
        tags={"pgcdc/job": INITIAL_SNAPSHOT},
    )
    microbatch = dg.define_asset_job(
        MICROBATCH, selection=capture,
        description="Read bounded slot windows into bronze (exactly once), merge silver, "
        "advance the slot.",
        executor_def=dg.in_process_executor,
        tags={"pgcdc/job": MICROBATCH},
    )
    checks = dg.define_asset_job(
        CAPTURE_CHECKS, selection=dg.AssetSelection.all_asset_checks(),
        description="Every asset check: silver against the source (full scan of both), "
        "bronze LSN windows, schema drift, slot health.",
        executor_def=dg.in_process_executor,
        tags={"pgcdc/job": CAPTURE_CHECKS},
    )
    return CaptureJobs(initial_snapshot, microbatch, checks)


CAPTURE_JOBS = (MICROBATCH, INITIAL_SNAPSHOT, INCREMENTAL)
"""The jobs that read the slot: while one is queued or running, another would only wait."""


def run_in_flight(instance: dg.DagsterInstance,
                  job_names: tuple[str, ...] = CAPTURE_JOBS) -> str | None:
    """A queued or running run of one of ``job_names`` (``<job> run <id>``), if any."""
    for job_name in job_names:
        runs = instance.get_runs(dg.RunsFilter(job_name=job_name, statuses=list(IN_FLIGHT)),
                                 limit=1)
        if runs:
            return f"{job_name} run {runs[0].run_id}"
    return None
