"""The capture runs' LSN ranges of many tables, read in a fixed number of instance queries.

Real runs on a real (SQLite) instance record what the capture records: lean runs an
observation of the slot with their range (and materializations of the tables they changed),
asset-job runs bronze materializations with the range, a wipe of one table's history. The
bulk read (:func:`assets.run_ranges.table_runs`) must give every table exactly what the
per-table read it replaced gave (the slot's runs merged with the table's own
materializations, newest ``limit``), and ask the instance as many times for 2 tables as for
8.
"""

# No ``from __future__ import annotations``: Dagster reads the op's context annotation.

from typing import Any

import dagster as dg
import pytest

from pgcdc_dagster.assets.keys import SLOT_KEY, bronze_key
from pgcdc_dagster.assets.run_ranges import CAPTURE_RUN, RecentReads, slot_runs, table_runs
from pgcdc_dagster.cdc.lsn import Lsn
from tests.support.instance_reads import counting_instance_reads

pytestmark = [pytest.mark.dagster, pytest.mark.unit]

KEYS = [bronze_key("s", f"t{i}") for i in range(8)]


def _record(instance: dg.DagsterInstance, events: list[Any]) -> None:
    """One run whose op logs ``events``."""
    @dg.op
    def emit(context: dg.OpExecutionContext) -> None:
        for e in events:
            context.log_event(e)

    @dg.job
    def run() -> None:
        emit()

    assert run.execute_in_process(instance=instance).success


def _range(start: int, end: int, snapshot: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"lsn_start": str(Lsn(start)), "lsn_end": str(Lsn(end))}
    if snapshot is not None:
        meta["snapshot_lsn"] = str(Lsn(snapshot))
    return meta


def _lean(instance: dg.DagsterInstance, start: int, end: int, changed: list[dg.AssetKey],
          snapshot: int | None = None) -> None:
    meta = _range(start, end, snapshot)
    _record(instance, [dg.AssetObservation(asset_key=SLOT_KEY, metadata={CAPTURE_RUN: True,
                                                                         **meta}),
                       *(dg.AssetMaterialization(asset_key=k, metadata=meta) for k in changed)])


def _per_table(instance: dg.DagsterInstance, key: dg.AssetKey,
               limit: int) -> list[tuple[str, str, str, str]]:
    """The read the sweep replaced: the slot's runs, then this table's own materializations
    (one query per table)."""
    on_slot, floor = slot_runs(instance, limit)
    by_run = dict(on_slot)
    for rec in instance.fetch_materializations(key, limit=limit).records:
        mat = rec.asset_materialization
        if mat is not None and rec.storage_id >= floor:
            by_run.setdefault(rec.run_id, (rec.storage_id, mat.metadata))
    out = []
    for run_id, (_, meta) in sorted(by_run.items(), key=lambda i: i[1][0])[-limit:]:
        values = {k: v.value for k, v in meta.items()}
        out.append((run_id[:8], str(values.get("snapshot_lsn")), str(values.get("lsn_start")),
                    str(values.get("lsn_end"))))
    return out


def _as_tuples(runs: list[Any]) -> list[tuple[str, str, str, str]]:
    return [(r.label, str(r.snapshot_lsn), str(r.start), str(r.end)) for r in runs]


def test_bulk_ranges_equal_the_per_table_reads() -> None:
    with dg.instance_for_test() as instance:
        _lean(instance, 0x100, 0x100, KEYS, snapshot=0x100)  # the initial snapshot
        position = 0x100
        for i in range(6):  # lean micro-batches, each changing two tables
            _lean(instance, position, position + 0x10, KEYS[i:i + 2])
            position += 0x10
        # An asset-job run (no slot observation) wrote t1, t2 and t3 with its range ...
        _record(instance, [dg.AssetMaterialization(asset_key=k,
                                                   metadata=_range(position, position + 8))
                           for k in KEYS[1:4]])
        position += 8
        # ... t3's history was wiped (that run no longer counts), then another wrote it. (The
        # SQLite index drops a wiped asset's events; a PostgreSQL instance keeps them and
        # filters by the wipe time, as run_ranges does.)
        instance.wipe_assets([KEYS[3]])
        _record(instance, [dg.AssetMaterialization(asset_key=KEYS[3],
                                                   metadata=_range(position, position + 4))])
        _lean(instance, position + 4, position + 0x20, KEYS[6:])

        for limit in (200, 4, 1):  # every observation read; the slot's newest only
            with counting_instance_reads() as reads:
                bulk = table_runs(instance, KEYS, limit)
            for key in KEYS:
                assert _as_tuples(bulk[key]) == _per_table(instance, key, limit), (key, limit)
            with counting_instance_reads() as fewer:
                table_runs(instance, KEYS[:2], limit)
            assert reads[0] == fewer[0], (limit, reads, fewer)
        every = table_runs(instance, KEYS, 200)
        # the first asset-job run's range is in t1's and t2's chains, not in t3's (wiped)
        lean = {r.label for r in every[KEYS[0]]}
        assert len(lean) == 8  # the snapshot and 7 lean runs
        first = {r.label for r in every[KEYS[1]]} - lean
        assert len(first) == 1 and {r.label for r in every[KEYS[2]]} - lean == first
        second = {r.label for r in every[KEYS[3]]} - lean
        assert len(second) == 1 and second != first


def test_a_runs_later_reads_see_the_same_and_read_only_what_was_stored_since(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot's early reports check a batch of tables at a time: with the run's
    :class:`RecentReads`, each batch's look-back reads only the materializations stored
    since the batch before (before: all of them again, a cost that grew with the square of
    the table count), and every table's chain equals a fresh read's."""
    rows_read = [0]
    real = dg.DagsterInstance.get_asset_event_summary_records

    def counted(self: dg.DagsterInstance, *args: Any, **kwargs: Any) -> Any:
        page = real(self, *args, **kwargs)
        rows_read[0] += len(page)
        return page

    monkeypatch.setattr(dg.DagsterInstance, "get_asset_event_summary_records", counted)
    with dg.instance_for_test() as instance:
        _lean(instance, 0x100, 0x100, KEYS, snapshot=0x100)
        _record(instance, [dg.AssetMaterialization(asset_key=k, metadata=_range(0x100, 0x108))
                           for k in KEYS[:3]])  # an asset-job run: its own range
        recent = RecentReads()
        incremental = 0
        for limit in (4, 200):
            position, floor_before = 0x108, None
            for batch in range(4):  # batches of tables materialized, then checked
                changed = KEYS[batch * 2:batch * 2 + 3]
                _lean(instance, position, position + 0x10, changed)
                position += 0x10
                floor = slot_runs(instance, limit)[1]
                rows_read[0] = 0
                memo = table_runs(instance, KEYS, limit, recent=recent)
                later = rows_read[0]
                rows_read[0] = 0
                fresh = table_runs(instance, KEYS, limit)
                assert {k: _as_tuples(v) for k, v in memo.items()} == \
                    {k: _as_tuples(v) for k, v in fresh.items()}, (limit, batch)
                if floor == floor_before:  # same look-back: only the rows stored since
                    assert later == len(changed) < rows_read[0], (limit, batch, later)
                    incremental += 1
                else:  # a new floor or limit: read afresh
                    assert later == rows_read[0], (limit, batch, later, rows_read[0])
                floor_before = floor
        assert incremental >= 4
