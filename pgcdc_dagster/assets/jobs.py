"""The capture jobs: initial snapshot, micro-batch, checks (teardown is in operations.py).

``initial_snapshot`` and ``cdc_microbatch`` are lean op jobs (``capture_run.py``): they write
bronze then silver and report materializations and the light checks (LSN windows, schema
drift, slot health) of the tables they changed only, so a run's cost follows its changes, not
the captured table count. They are the only writers of the bronze and silver assets (asset
specs): to materialize them now, launch ``cdc_microbatch`` (or ``initial_snapshot``).
``capture_checks`` is a lean op job too (``check_sweep.py``): every check of every table,
including the full silver-against-source comparison, in one op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg

from pgcdc_dagster.assets.capture_run import build_capture_job, build_capture_op
from pgcdc_dagster.assets.check_sweep import build_checks_job
from pgcdc_dagster.assets.naming import DEFAULT_NAMES, CaptureNames
from pgcdc_dagster.ops.settings import MonitorSettings

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
    """The jobs of one capture."""

    initial_snapshot: dg.JobDefinition
    microbatch: dg.JobDefinition
    checks: dg.JobDefinition

    def all(self) -> list[dg.JobDefinition]:
        return [self.initial_snapshot, self.microbatch, self.checks]


def capture_jobs(names: CaptureNames = DEFAULT_NAMES) -> tuple[str, ...]:
    """The names of the capture's jobs that read the slot (:data:`CAPTURE_JOBS`)."""
    return tuple(names.scoped(job) for job in CAPTURE_JOBS)


def job_tags(base: str, names: CaptureNames) -> dict[str, str]:
    """``pgcdc/job`` (the unscoped job name) and, for a named capture, ``pgcdc/capture``."""
    return {"pgcdc/job": base, **({"pgcdc/capture": names.name} if names.name else {})}


def build_jobs(tables: Sequence[tuple[str, str]],
               settings: MonitorSettings | None = None, *,
               names: CaptureNames = DEFAULT_NAMES) -> CaptureJobs:
    """The capture jobs for the given tables."""
    settings = settings if settings is not None else MonitorSettings()
    op = build_capture_op(tables, settings, names=names)
    return CaptureJobs(_initial_snapshot(op, names), _microbatch(op, names),
                       _checks(tables, settings, names))


LEAN_JOBS = (INITIAL_SNAPSHOT, MICROBATCH, CAPTURE_CHECKS)
"""The op jobs that need no asset definitions to run (they report events of asset keys)."""


def build_lean_job(name: str, tables: Sequence[tuple[str, str]],
                   settings: MonitorSettings, *,
                   names: CaptureNames = DEFAULT_NAMES) -> dg.JobDefinition:
    """One of :data:`LEAN_JOBS`, built alone, exactly as :func:`build_jobs` builds it (a
    process that executes it needs no other definition: ``definitions.py``)."""
    if name == CAPTURE_CHECKS:
        return _checks(tables, settings, names)
    op = build_capture_op(tables, settings, names=names)
    if name == INITIAL_SNAPSHOT:
        return _initial_snapshot(op, names)
    if name == MICROBATCH:
        return _microbatch(op, names)
    raise ValueError(f"{name!r} is not one of the lean jobs {', '.join(LEAN_JOBS)}")


def _initial_snapshot(op: dg.OpDefinition, names: CaptureNames) -> dg.JobDefinition:
    return build_capture_job(
        INITIAL_SNAPSHOT, op, snapshot_step=True, names=names,
        description="Create the slot, snapshot every captured table (bronze op=r and the "
        "silver baseline), then catch up with the stream; reports each table snapshotted.")


def _microbatch(op: dg.OpDefinition, names: CaptureNames) -> dg.JobDefinition:
    return build_capture_job(
        MICROBATCH, op, snapshot_step=False, names=names,
        description="Read bounded slot windows into bronze (exactly once), merge silver, "
        "advance the slot; reports materializations and light checks of the tables changed "
        "only.")


def _checks(tables: Sequence[tuple[str, str]], settings: MonitorSettings,
            names: CaptureNames) -> dg.JobDefinition:
    return build_checks_job(
        names.scoped(CAPTURE_CHECKS), tables, settings, names=names,
        description="Every check of every captured table: silver against the source (full "
        "scan of both), bronze LSN windows, schema drift, and slot health; reported as "
        "evaluations of the asset checks (one op, no per-check planning).",
        tags=job_tags(CAPTURE_CHECKS, names))


CAPTURE_JOBS = (MICROBATCH, INITIAL_SNAPSHOT, INCREMENTAL)
"""The jobs that read the slot: while one is queued or running, another would only wait."""
