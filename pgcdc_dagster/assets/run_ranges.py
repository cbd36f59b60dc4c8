"""The WAL ranges the capture runs read, as the instance recorded them, for many tables at once.

The LSN-window check (``lsn_windows_contiguous``) chains a bronze table's capture runs. Two
records hold them:

* each lean capture run (``cdc_microbatch``, ``initial_snapshot``) records one observation of
  ``source/replication_slot`` with its range, whatever tables it changed;
* incremental-snapshot runs record the range on the bronze materializations of the tables
  they wrote.

A sweep over many tables reads them in a fixed number of instance queries, not one per table:
the slot's observations; the materialization events since the oldest of them,
projected onto their indexed columns (no payload); the payloads of the few whose run recorded
no observation; the tables' wipe times.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dagster as dg

from pgcdc_dagster.assets.keys import SLOT_KEY
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


def slot_runs(instance: dg.DagsterInstance, limit: int,
              slot_key: dg.AssetKey = SLOT_KEY) -> SlotRuns:
    """The ranges the lean capture runs recorded on the slot (one observation per run)."""
    records = instance.fetch_observations(slot_key, limit=limit).records
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


Summary = tuple[int, float, str]
"""A materialization as the look-back projects it: (storage id, timestamp, run id)."""


@dataclasses.dataclass
class RecentReads:
    """The materializations one run's checks have read so far. Materializations
    are only appended, so a later read in the same run asks only for those stored since the
    newest it saw: a snapshot's early reports (a batch of tables at a time) read each
    materialization once, not once per batch (which grew with the square of the table count).
    Reset when the floor or the limit changes. Holds at most ``limit`` entries per asset."""

    floor: int = -1
    limit: int = 0
    newest: int = -1
    """The highest storage id read (-1: none)."""
    by_key: dict[dg.AssetKey, list[Summary]] = dataclasses.field(default_factory=dict)
    """Each asset's newest ``limit`` materializations at or after ``floor``, newest first."""


def _recent_materializations(instance: dg.DagsterInstance, keys: Iterable[dg.AssetKey],
                             floor: int, limit: int, recent: RecentReads | None = None
                             ) -> dict[dg.AssetKey, list[Summary]]:
    """Each key's last ``limit`` materializations at or after ``floor``, newest first, as
    (storage id, timestamp, run id): projections of every asset's materializations, newest
    first, a page at a time, down to ``floor`` or, with ``recent``, to the newest read
    before (``recent`` is updated)."""
    wanted = set(keys)
    if recent is None or recent.floor != floor or recent.limit != limit:
        recent = RecentReads(floor=floor, limit=limit) if recent is None else \
            _reset(recent, floor, limit)
    lowest = max(floor - 1, recent.newest)
    found: dict[dg.AssetKey, list[Summary]] = {}
    newest = recent.newest
    before: int | None = None
    while True:
        page = instance.get_asset_event_summary_records(
            dg.DagsterEventType.ASSET_MATERIALIZATION,
            after_storage_id=lowest if lowest >= 0 else None, before_storage_id=before,
            limit=SUMMARY_PAGE)
        for row in page:
            newest = max(newest, row.storage_id)
            rows = found.setdefault(row.asset_key, [])
            if row.run_id is not None and len(rows) < limit:
                rows.append((row.storage_id, row.timestamp, row.run_id))
        if len(page) < SUMMARY_PAGE:
            break
        before = page[-1].storage_id
    for key, rows in found.items():
        if rows:
            recent.by_key[key] = (rows + recent.by_key.get(key, []))[:limit]
    recent.newest = newest
    return {key: recent.by_key[key] for key in wanted if key in recent.by_key}


def _reset(recent: RecentReads, floor: int, limit: int) -> RecentReads:
    recent.floor, recent.limit, recent.newest = floor, limit, -1
    recent.by_key.clear()
    return recent


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
               observed: SlotRuns | None = None, recent: RecentReads | None = None,
               slot_key: dg.AssetKey = SLOT_KEY) -> dict[dg.AssetKey, list[RunRange]]:
    """The capture runs' ranges of each bronze table (``keys``), oldest first: the ranges
    the lean runs recorded on the slot merged with the table's own bronze materializations
    of other runs, one range per run, the last ``limit``. ``observed``: :func:`slot_runs`
    when already read; ``recent``: what this run read before (:class:`RecentReads`). A fixed
    number of instance queries whatever the number of keys."""
    on_slot, floor = observed if observed is not None else slot_runs(instance, limit,
                                                                     slot_key)
    recent_of = _recent_materializations(instance, keys, floor, limit, recent) if keys else {}
    # A lean run's materializations repeat the range of its observation: their payloads are
    # not needed, nor, when a table has no other, its wipe time.
    others = {key: [r for r in rows if r[2] not in on_slot] for key, rows in recent_of.items()}
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
