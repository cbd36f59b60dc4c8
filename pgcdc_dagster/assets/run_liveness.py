"""Capture runs hold the slot's lock until they end; a run nobody holds it for is dead.

A capture run (``cdc_microbatch``, ``initial_snapshot``, ``incremental_snapshot``) takes the
slot's lock (:mod:`pgcdc_dagster.postgres.slot_lock`) at the start of its first capture step,
tags itself :data:`SLOT_LOCK_TAG`, and keeps the lock until the run ends (the
``CaptureResource`` releases it at teardown). A killed worker (SIGKILL, OOM killer, lost
node) cannot end its run: Dagster's default run launcher leaves it ``STARTED`` for ever, and
the schedule and the lag sensor would skip every tick while WAL grows. Its lock, however,
dies with its database session. So :func:`live_run_in_flight` calls an in-flight capture run
dead when

* nobody holds the slot's lock (``pg_locks``; a run on another host that holds it is alive),
* and the run logged nothing for the grace period (``PGCDC_DEAD_RUN_GRACE_SECONDS``) when it
  had taken the lock, or for :data:`UNLOCKED_GRACE_S` when it never took it (a run waiting
  for the ``pgcdc_slot`` pool logs that every 300 s, and a run that has only just started
  has not reached its first step yet),

marks it failed with the reason, frees its pool slots, and lets the tick go on. ``QUEUED``
runs are never judged: they wait for the run queue, not for a worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC

import dagster as dg
import psycopg2

from pgcdc_dagster.assets.jobs import CAPTURE_JOBS, IN_FLIGHT
from pgcdc_dagster.assets.slot_hold import SLOT_LOCK_TAG
from pgcdc_dagster.exceptions import PgCdcError
from pgcdc_dagster.postgres.connection import redact
from pgcdc_dagster.postgres.slot_lock import LockHolder, slot_lock_holder

DEAD_TAG = "pgcdc/marked_dead"
"""Tag set on a run marked failed as dead (value: who noticed)."""
UNLOCKED_GRACE_S = 900.0
"""Quiet time after which an in-flight capture run that never took the lock is dead."""


def _describe(run: dg.DagsterRun) -> str:
    return f"{run.job_name} run {run.run_id}"


def _last_activity(instance: dg.DagsterInstance, run: dg.DagsterRun) -> float:
    """When the run last logged an event (or was created)."""
    records = instance.get_records_for_run(run.run_id, ascending=False, limit=1).records
    if records:
        return float(records[0].timestamp)
    record = instance.get_run_record_by_id(run.run_id)
    if record is None:
        return time.time()
    created = record.create_timestamp
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    return created.timestamp()


def _in_flight(instance: dg.DagsterInstance,
               job_names: Sequence[str]) -> list[dg.DagsterRun]:
    runs: list[dg.DagsterRun] = []
    for job_name in job_names:
        runs.extend(instance.get_runs(dg.RunsFilter(job_name=job_name,
                                                    statuses=list(IN_FLIGHT))))
    return runs


def live_run_in_flight(instance: dg.DagsterInstance, dsn: str, slot: str, grace_s: float,
                       log: logging.Logger | None = None, *, noticed_by: str,
                       job_names: Sequence[str] = CAPTURE_JOBS) -> str | None:
    """A live queued or running capture run (``<job> run <id>``), after marking dead ones
    failed (and freeing the pool slots runs that have ended still hold); None when none is
    left."""
    free_slots_of_ended_runs(instance, log)
    runs = _in_flight(instance, job_names)
    if not runs:
        return None
    now = time.time()
    suspects: list[tuple[dg.DagsterRun, float]] = []
    live: list[dg.DagsterRun] = []
    for run in runs:
        if run.status == dg.DagsterRunStatus.QUEUED:
            live.append(run)
            continue
        quiet = now - _last_activity(instance, run)
        took_lock = run.tags.get(SLOT_LOCK_TAG) is not None
        if quiet >= (grace_s if took_lock else max(grace_s, UNLOCKED_GRACE_S)):
            suspects.append((run, quiet))
        else:
            live.append(run)
    if suspects:
        try:
            holder = slot_lock_holder(dsn, slot)
        except (PgCdcError, psycopg2.Error) as exc:
            first = suspects[0][0]
            return (f"{_describe(first)} (whether it is alive is unknown: the slot's lock "
                    f"could not be read: {redact(str(exc)).strip()})")
        if holder is not None:
            return _holding(runs, holder)
        for run, quiet in suspects:
            _mark_dead(instance, run, slot, quiet, noticed_by, log)
    return _describe(live[0]) if live else None


ENDED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE,
         dg.DagsterRunStatus.CANCELED)


def free_slots_of_ended_runs(instance: dg.DagsterInstance,
                             log: logging.Logger | None = None) -> list[str]:
    """Free the concurrency-pool slots that runs which have ended still hold; return their ids.

    A run worker killed in a step cannot free its ``pgcdc_slot`` slot. When Dagster itself
    fails the run (run monitoring's worker health check does within seconds), the run is no
    longer in flight, but its slot stays claimed until run monitoring's
    ``free_slots_after_run_end_seconds`` (300 s unless set): the next micro-batch would wait
    for the pool that long. An ended run runs no step, so its slots are freed at once here.
    """
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return []
    holders = storage.get_concurrency_run_ids()
    if not holders:
        return []
    records = instance.get_run_records(dg.RunsFilter(run_ids=sorted(holders),
                                                     statuses=list(ENDED)))
    freed = []
    for record in records:
        run = record.dagster_run
        storage.free_concurrency_slots_for_run(run.run_id)
        freed.append(run.run_id)
        if log is not None:
            log.warning(f"freed the concurrency pool slots of {_describe(run)}: it is "
                        f"{run.status.value} but still held them (its worker died in a "
                        "step), so the next capture run would have waited for the pool")
    return freed


def _holding(runs: Sequence[dg.DagsterRun], holder: LockHolder) -> str:
    """The in-flight run the holder belongs to, else the first one, with the holder."""
    match = [r for r in runs if r.run_id == holder.run_id]
    run = match[0] if match else runs[0]
    return f"{_describe(run)} (the slot's lock is held: {holder.describe()})"


def _mark_dead(instance: dg.DagsterInstance, run: dg.DagsterRun, slot: str, quiet: float,
               noticed_by: str, log: logging.Logger | None) -> None:
    message = (
        f"{_describe(run)} marked failed by {noticed_by}: it is {run.status.value} but its "
        f"worker is gone (killed, OOM-killed or lost): nobody holds the lock of replication "
        f"slot {slot!r} and the run logged nothing for {quiet:.0f} s. Nothing is lost: what "
        "it had not committed stays in the slot, and the next run reads it from the slot's "
        "confirmed position.")
    instance.add_run_tags(run.run_id, {DEAD_TAG: noticed_by})
    instance.report_run_failed(run, message)
    storage = instance.event_log_storage
    if storage.supports_global_concurrency_limits:
        storage.free_concurrency_slots_for_run(run.run_id)  # its pool slot, if it held one
    if log is not None:
        log.warning(message)
