"""A capture run takes the slot's lock in its first capture step and keeps it to its end.

The lock (:mod:`pgcdc_dagster.postgres.slot_lock`) is held by the run's ``CaptureResource``
and released when the run ends; the run is tagged :data:`SLOT_LOCK_TAG`, which tells the
dead-run detection (``assets/run_liveness.py``) that the run reached the slot.
"""

from __future__ import annotations

import dagster as dg

from pgcdc_dagster.postgres.slot_lock import SlotLease
from pgcdc_dagster.resources import CaptureResource

SLOT_LOCK_TAG = "pgcdc/slot_lock"
"""Tag of a capture run that has taken the slot's lock (value: the lock session's pid)."""


def hold_slot_for_run(context: dg.AssetExecutionContext | dg.OpExecutionContext,
                      capture: CaptureResource,
                      dsn: str) -> SlotLease:
    """Take the slot's lock for the rest of the run and tag the run as holding it.

    Raises:
        SlotInUseError: another reader holds the slot; the step stops before any work.
    """
    lease = capture.hold_slot(dsn, context.run_id)
    if context.run.tags.get(SLOT_LOCK_TAG) is None:
        context.instance.add_run_tags(context.run_id, {SLOT_LOCK_TAG: str(lease.pid)})
        context.log.info(f"holding the lock of replication slot {capture.slot!r} (session "
                         f"pid {lease.pid}) until the run ends")
    return lease
