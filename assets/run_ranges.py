"""The WAL ranges the capture runs read, as the instance recorded them, for many tables at once.

The LSN-window check (``lsn_windows_contiguous``) chains a bronze table's capture runs. Two
records hold them:

* each lean capture run (``cdc_microbatch``, ``initial_snapshot``) records one observation of
  ``source/replication_slot`` with its range, whatever tables it changed;
* asset-job and incremental-snapshot runs record the range on the bronze materializations of
  the tables they wrote.

A sweep over many tables reads them in a fixed number of instance queries, not one per table
(issue 16): the slot's observations; the materialization events since the oldest of them,
projected onto their indexed columns (no payload); the payloads of the few whose run recorded
no observation; the tables' wipe times.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dagster as dg

from assets.keys import SLOT_KEY
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.ops.lsn_windows import RunRange

CAPTURE_RUN = "capture_run"
"""Metadata flag of the slot observation each lean capture run records (its LSN range)."""

SUMMARY_PAGE = 10_000
"""Materialization events read per query (indexed columns only) while looking back."""
PAYLOAD_PAGE = 500
"""Materialization payloads read per query (by storage id)."""

SlotRuns = tuple[dict[str, tuple[int, Any]], int]
"""The capture runs' ranges recorded on the slot (run id -> (storage id, metadata)) and the
lowest storage id they cover (0 when every observation was read)."""


def slot_runs(instance: dg.DagsterInstance, limit: int) -> SlotRuns:
    """The ranges the lean capture runs recorded on the slot (one observation per run)."""
    records = instance.fetch_observations(SLOT_KEY, limit=limit).records
    by_run: dict[str, tuple[int, Any]] = {}
    for obs in records:
        event = obs.asset_observation
        if event is not None and CAPTURE_RUN in event.metadata:
            by_run[obs.run_id] = (obs.storage_id, event.metadata)
    floor = min(r.storage_id for r in records) if len(records) >= limit else 0
    return by_run, floor


def with_running(observed: SlotRuns, run_id: str, metadata: Mapping[str, Any]) -> SlotRuns:
    """``observed`` with the range of a run still going on (``metadata``: what its slot
    observation will hold, plain values), newest: the checks it evaluates before its
    observation is written chain it like the finished runs, and skip its own
    materializations."""
    by_run, floor = observed
    values = {name: dg.TextMetadataValue(str(value)) for name, value in metadata.items()}
    return {**by_run, run_id: (sys.maxsize, values)}, floor


def _lsn(meta: Mapping[str, Any], name: str) -> Lsn | None:
    value = meta.get(name)
    try:
        return Lsn.parse(str(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None


def _ranges(by_run: Mapping[str, tuple[int, Any]], limit: int) -> list[RunRange]:
    """The last ``limit`` runs' ranges, oldest first."""
    recent = sorted(by_run.items(), key=lambda item: item[1][0])[-limit:]
    runs = []
    for run_id, (_, metadata) in recent:
        meta = {k: v.value for k, v in metadata.items()}
        runs.append(RunRange(run_id[:8], _lsn(meta, "snapshot_lsn"), _lsn(meta, "lsn_start"),
                             _lsn(meta, "lsn_end")))
    return runs


def _wiped(instance: dg.DagsterInstance, keys: Sequence[dg.AssetKey]) -> dict[dg.AssetKey, float]:
    """When each asset's history was last wiped (events up to then no longer count)."""
    wiped: dict[dg.AssetKey, float] = {}
    if not keys:
        return wiped
    for record in instance.get_asset_records(list(keys)):
        details = record.asset_entry.asset_details
        if details is not None and details.last_wipe_timestamp:
            wiped[record.asset_entry.asset_key] = details.last_wipe_timestamp
    return wiped


def _recent_materializations(instance: dg.DagsterInstance, keys: Iterable[dg.AssetKey],
                             floor: int, limit: int
                             ) -> dict[dg.AssetKey, list[tuple[int, float, str]]]:
    """Each key's last ``limit`` materializations at or after ``floor``, newest first, as
    (storage id, timestamp, run id): projections of every asset's materializations, newest
    first, a page at a time, until ``floor`` or the oldest."""
    wanted = set(keys)
    found: dict[dg.AssetKey, list[tuple[int, float, str]]] = defaultdict(list)
    before: int | None = None
    while True:
        page = instance.get_asset_event_summary_records(
            dg.DagsterEventType.ASSET_MATERIALIZATION,
            after_storage_id=floor - 1 if floor > 0 else None, before_storage_id=before,
            limit=SUMMARY_PAGE)
        for row in page:
            key = row.asset_key
            if key in wanted and row.run_id is not None and len(found[key]) < limit:
                found[key].append((row.storage_id, row.timestamp, row.run_id))
        if len(page) < SUMMARY_PAGE:
            return found
        before = page[-1].storage_id


def _payloads(instance: dg.DagsterInstance, storage_ids: Sequence[int]) -> dict[int, Any]:
    """The metadata of the given materialization events, by storage id."""
    out: dict[int, Any] = {}
    for start in range(0, len(storage_ids), PAYLOAD_PAGE):
        ids = storage_ids[start:start + PAYLOAD_PAGE]
        for record in instance.event_log_storage.get_event_records(
                dg.EventRecordsFilter(dg.DagsterEventType.ASSET_MATERIALIZATION,
                                      storage_ids=ids), limit=len(ids)):
            mat = record.asset_materialization
            if mat is not None:
                out[record.storage_id] = mat.metadata
    return out


def table_runs(instance: dg.DagsterInstance, keys: Sequence[dg.AssetKey], limit: int,
               observed: SlotRuns | None = None) -> dict[dg.AssetKey, list[RunRange]]:
    """The capture runs' ranges of each bronze table (``keys``), oldest first: the ranges
    the lean runs recorded on the slot merged with the table's own bronze materializations
    of other runs, one range per run, the last ``limit``. ``observed``: :func:`slot_runs`
    when already read. A fixed number of instance queries whatever the number of keys."""
    on_slot, floor = observed if observed is not None else slot_runs(instance, limit)
    recent = _recent_materializations(instance, keys, floor, limit) if keys else {}
    # A lean run's materializations repeat the range of its observation: their payloads are
    # not needed, nor, when a table has no other, its wipe time.
    others = {key: [r for r in rows if r[2] not in on_slot] for key, rows in recent.items()}
    wiped = _wiped(instance, sorted((k for k, rows in others.items() if rows), key=str))
    extra: dict[dg.AssetKey, dict[str, int]] = {}
    for key in keys:
        runs: dict[str, int] = {}
        for storage_id, timestamp, run_id in others.get(key, []):
            # newest first: a run that materialized the table twice counts its last
            if timestamp > wiped.get(key, float("-inf")):
                runs.setdefault(run_id, storage_id)
        extra[key] = runs
    payloads = _payloads(instance, sorted({s for r in extra.values() for s in r.values()}))
    out = {}
    for key in keys:
        by_run = dict(on_slot)
        for run_id, storage_id in extra[key].items():
            if storage_id in payloads:
                by_run[run_id] = (storage_id, payloads[storage_id])
        out[key] = _ranges(by_run, limit)
    return out
