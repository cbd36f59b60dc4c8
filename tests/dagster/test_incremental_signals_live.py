"""pause-snapshot, resume-snapshot and stop-snapshot against a snapshot in progress, through both
channels (INC-13 signalling table, INC-19 id/type/data, INC-04 resumable):

* the signalling table: a row inserted while a chunk is being read, picked up by a
  ``signal_table_sensor`` evaluation (the sensor applies it; ``resume-snapshot`` yields the run
  request that continues the snapshot);
* Dagster: the ``incremental_snapshot_signal`` job, run while a chunk is being read.

The incremental run is a real ``incremental_snapshot`` job execution (chunk size 64, 200 rows:
4 chunks). The signal is sent from inside the chunk read (the reader thread waits for it), so
it lands deterministically while chunk 2 (or 1) is in flight: that chunk still commits, no
further chunk is read; resume continues at the next chunk; stop leaves no further chunk.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import dagster as dg
import pytest

from pgcdc_dagster.capture import incremental
from pgcdc_dagster.capture.incremental_state import ProgressStore
from pgcdc_dagster.postgres.signals import create_signal_table
from tests.dagster import test_incremental_job
from tests.dagster.test_incremental_job import (
    _check_silver,
    _incremental_rows,
    _partition_mats,
    _tick,
)

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

capture = test_incremental_job.capture  # the fixture: initial snapshot of items and tags
Send = Callable[[str, str], list[dg.RunRequest]]


def _failure(result: dg.ExecuteInProcessResult) -> str:
    return " ".join(str(e.event_specific_data.error)  # type: ignore[union-attr]
                    for e in result.all_events if e.is_step_failure)


@pytest.mark.parametrize("channel", ["signal_table", "dagster_job"])
def test_pause_resume_stop_while_running(channel, capture, pg_conn, monkeypatch) -> None:
    definitions, instance, lakehouse = capture
    job = definitions.resolve_job_def("incremental_snapshot")
    settings = definitions.resources["capture"].settings(  # type: ignore[attr-defined]
        definitions.resources["postgres"].dsn, lakehouse)  # type: ignore[attr-defined]
    store = ProgressStore(settings.lakehouse, settings.slot)
    create_signal_table(pg_conn, "public.dbz_signal")
    cursor: list[str | None] = [None]
    counter = [0]

    def via_table(kind: str, data: str) -> list[dg.RunRequest]:
        counter[0] += 1
        with pg_conn.cursor() as cur:
            cur.execute("INSERT INTO dbz_signal VALUES (%s, %s, %s)",
                        (f"{kind}-{counter[0]}", kind, data))
        if threading.current_thread() is threading.main_thread():
            result = _tick(definitions, instance, cursor[0])
        else:  # the chunk reader: a sqlite instance must stay in its own thread
            with dg.DagsterInstance.ephemeral() as own:
                result = _tick(definitions, own, cursor[0])
        cursor[0] = result.cursor
        return list(result.run_requests)

    signal_job = definitions.resolve_job_def("incremental_snapshot_signal")

    def via_dagster(kind: str, data: str) -> list[dg.RunRequest]:
        # Its own (ephemeral) instance: it may run while the snapshot run executes; the
        # signal's effect is the progress store, shared through the lakehouse.
        with dg.DagsterInstance.ephemeral() as own:
            res = signal_job.execute_in_process(instance=own, run_config={"ops": {
                "apply_incremental_signal": {"config": {"type": kind, "data": data}}}})
        assert res.success
        return []

    send: Send = via_table if channel == "signal_table" else via_dagster
    real = incremental.read_chunk
    reads: list[list[str | None] | None] = []
    at: dict[int, tuple[str, str]] = {}

    def signalling_read(dsn, spec, after, upto, limit):  # type: ignore[no-untyped-def]
        reads.append(None if after is None else list(after))
        todo = at.pop(len(reads), None)
        if todo is not None:  # while this chunk is in flight
            send(*todo)
        return real(dsn, spec, after, upto, limit)

    monkeypatch.setattr(incremental, "read_chunk", signalling_read)

    # 1. execute-snapshot; pause-snapshot arrives while chunk 2 is read.
    requests = send("execute-snapshot", '{"data-collections": ["public.items"]}')
    tags = requests[0].tags if requests else {}
    if channel == "signal_table":
        assert [r.partition_key for r in requests] == ["public.items"]
    at[2] = ("pause-snapshot", "")
    paused = job.execute_in_process(instance=instance, partition_key="public.items",
                                    tags=tags, raise_on_error=False)
    assert not paused.success and "public.items is paused" in _failure(paused)
    assert len(reads) == 2  # the chunk in flight finished; no third chunk was read
    progress = store.load("public", "items")
    assert progress is not None and progress.status == "paused"
    assert progress.chunks_done == 2 and progress.last_key == ["128"]
    assert sorted(r["id"] for r in _incremental_rows(lakehouse, "items")) == \
        list(range(1, 129))

    # 2. resume-snapshot: a run continues at chunk 3 (the table channel requests it).
    requests = send("resume-snapshot", "")
    if channel == "signal_table":
        assert [(r.partition_key, r.run_key) for r in requests] == [
            ("public.items", f"resume-snapshot-{counter[0]}")]
    tags = requests[0].tags if requests else {}
    resumed = job.execute_in_process(instance=instance, partition_key="public.items",
                                     tags=tags)
    assert resumed.success
    assert reads[2] == ["128"]  # the next chunk, not the start
    assert _partition_mats(instance)["public.items"]["chunks_done"] == 4
    assert sorted(r["id"] for r in _incremental_rows(lakehouse, "items")) == \
        list(range(1, 201))  # each row exactly once over the paused and the resumed run
    _check_silver(pg_conn, lakehouse)

    # 3. A new snapshot; stop-snapshot arrives while its first chunk is read.
    send("execute-snapshot", '{"data-collections": ["public.items"]}')
    before = len(reads)
    at[before + 1] = ("stop-snapshot", '{"data-collections": ["public.items"]}')
    stopped = job.execute_in_process(instance=instance, partition_key="public.items",
                                     raise_on_error=False)
    assert not stopped.success and "public.items is stopped" in _failure(stopped)
    assert len(reads) == before + 1  # no chunk after the one in flight
    progress = store.load("public", "items")
    assert progress is not None and progress.status == "stopped" and progress.chunks_done == 1
    ids = sorted(r["id"] for r in _incremental_rows(lakehouse, "items"))
    assert ids == sorted([*range(1, 201), *range(1, 65)])  # only the first chunk again
    _check_silver(pg_conn, lakehouse)
