"""The capture op holds the run's SQLite event files open while it reports (issue 16).

On the default SQLite event storage every write opens and closes a connection; when no other
connection is open, that close checkpoints the WAL into the database and deletes it, once per
event. Inside :func:`event_files_held` the WAL survives each write (no checkpoint per event),
every event is stored and read back as usual, and after the block the files are released (the
last close checkpoints, as Dagster's own would). Other storages are left alone.
"""

# No ``from __future__ import annotations``: Dagster reads the op's context annotation.

import os

import dagster as dg

from assets.event_storage import event_files_held

EVENTS = 20


def _wal_files(instance: dg.DagsterInstance, run_id: str) -> list[bool]:
    storage = instance.event_log_storage
    return [os.path.exists(storage.path_for_shard(shard) + "-wal")  # type: ignore[attr-defined]
            for shard in (run_id, "index")]


def test_event_files_stay_open_while_the_op_reports() -> None:
    seen: dict[str, object] = {}

    @dg.op
    def report(context: dg.OpExecutionContext) -> None:
        instance, run_id = context.instance, context.run_id
        with event_files_held(instance, run_id) as held:
            seen["held"] = held
            for i in range(EVENTS):
                context.log_event(dg.AssetMaterialization(asset_key=["bronze", "s", f"t{i}"],
                                                          metadata={"events": i}))
                context.log_event(dg.AssetCheckEvaluation(
                    asset_key=dg.AssetKey(["bronze", "s", f"t{i}"]), check_name="c",
                    passed=True))
            seen["inside"] = _wal_files(instance, run_id)
        context.log_event(dg.AssetMaterialization(asset_key=["bronze", "s", "after"]))
        seen["after"] = _wal_files(instance, run_id)

    @dg.job
    def reporting() -> None:
        report()

    with dg.instance_for_test() as instance:
        result = reporting.execute_in_process(instance=instance)
        assert result.success
        assert seen["inside"] == [True, True], "a write checkpointed the WAL away"
        assert seen["held"] == 2
        assert seen["after"] == [False, False], "the files were not released"
        stored = instance.get_records_for_run(result.run_id, limit=1000).records
        kinds = [r.event_log_entry.dagster_event_type for r in stored]
        assert kinds.count(dg.DagsterEventType.ASSET_MATERIALIZATION) == EVENTS + 1
        assert kinds.count(dg.DagsterEventType.ASSET_CHECK_EVALUATION) == EVENTS
        latest = instance.get_latest_materialization_event(dg.AssetKey(["bronze", "s", "t7"]))
        assert latest is not None and latest.asset_materialization is not None
        assert latest.asset_materialization.metadata["events"].value == 7

    with dg.DagsterInstance.ephemeral() as memory:  # not SQLite: nothing is held
        with event_files_held(memory, "any") as held:
            assert held == 0
