"""Progress: while a snapshot runs, the Dagster run's event log receives a line per
finished chunk of a table read in several chunks (single-chunk tables at most every few
seconds) with the rows read, the chunks done, the rate and the ETA; the bronze
materializations carry the figures as they stood when each table was committed.
"""

from __future__ import annotations

import re

import dagster as dg
import pytest

from pgcdc_dagster.capture.snapshot_progress import ProgressTracker
from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

LINE = re.compile(r"snapshot \d+: (\d+)/(\d+) chunks, ([\d,]+)/~([\d,]+) rows, ([\d,]+) rows/s, "
                  r"ETA (\d+s|\?) \(last: public\.(big|small)\)")


def test_snapshot_reports_progress_in_the_run_log(pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE big (id int PRIMARY KEY, v text); INSERT INTO big SELECT g, "
                    "repeat('v', 100) FROM generate_series(1, 30000) g; "
                    "CREATE TABLE small (id int PRIMARY KEY); INSERT INTO small VALUES (1); "
                    "ANALYZE big, small")
    defs = build_definitions([("public", "big"), ("public", "small")], {
        "postgres": PostgresResource(dsn=pg_dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables=r"public\.(big|small)", slot="dg_progress",
                                   publication="dg_progress", snapshot_chunk_bytes=1 << 20),
        "spark": SparkResource(),
    }, settings=MonitorSettings())
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("initial_snapshot").execute_in_process(instance=instance)
        assert result.success
        logged = [(e.timestamp, e.message) for e in instance.all_logs(result.run_id)
                  if e.message and LINE.search(e.message)]
    lines = [LINE.search(m) for _, m in logged]
    total = int(lines[0].group(2))  # type: ignore[union-attr]
    assert total >= 4, "big is read in several chunks"
    done = [int(m.group(1)) for m in lines if m]
    assert done == sorted(set(done)) and done[-1] == total, "lines as chunks finish"
    big_lines = [m for m in lines if m and m.group(7) == "big"]
    assert len(big_lines) == total - 1, "a line per chunk of a table read in several chunks"
    rows = [int(m.group(3).replace(",", "")) for m in lines if m]
    assert rows == sorted(rows) and rows[-1] == 30001
    assert all(int(m.group(4).replace(",", "")) >= 30000 for m in lines if m), "estimate"
    assert lines[-1].group(6) == "0s"  # type: ignore[union-attr]
    _eta_within_observed_pace(logged, [m for m in lines if m])
    mats = {"/".join(e.event_specific_data.materialization.asset_key.path):  # type: ignore
            {k: v.value for k, v in e.event_specific_data.materialization.metadata.items()}  # type: ignore
            for e in result.get_asset_materialization_events()}
    # Each table is reported as its commit is made, with the progress as it stood then: the
    # table committed last shows the whole snapshot.
    last = max((mats[f"bronze/public/{t}"] for t in ("big", "small")),
               key=lambda m: m["snapshot_chunks_done"])
    assert last["snapshot_rows_read"] == 30001
    assert last["snapshot_chunks_done"] == last["snapshot_chunks_total"] == total
    assert last["snapshot_rows_per_second"] > 0 and last["snapshot_eta_seconds"] == 0
    big = mats["bronze/public/big"]
    assert big["snapshot_rows_read"] >= 30000 and big["snapshot_chunks_done"] >= total - 1


def _eta_within_observed_pace(logged: list[tuple[float, str]], lines: list[re.Match[str]]
                              ) -> None:
    """No ETA before a second chunk (the first came after the workers' start); each later
    ETA at most the rest at the pace the run's own lines show since the first (by rows, or by
    chunks), with a second's slack for the log's timestamps."""
    first_at, first = logged[0][0], lines[0]
    total = int(first.group(2))
    if int(first.group(1)) < total:
        assert first.group(6) == "?", first.group(0)
    for (at, _), line in zip(logged[1:], lines[1:], strict=True):
        done, rows = int(line.group(1)), int(line.group(3).replace(",", ""))
        if done == total or line.group(6) == "?":
            continue
        span = at - first_at
        by_rows = (int(line.group(4).replace(",", "")) - rows) * span / max(
            rows - int(first.group(3).replace(",", "")), 1)
        by_chunks = span / (done - int(first.group(1))) * (total - done)
        assert int(line.group(6)[:-1]) <= max(by_rows, by_chunks) + 1, line.group(0)


def test_eta_leaves_out_the_workers_start() -> None:
    """The QA run's case: many single-chunk tables, the first chunk in after a 5 s start."""
    now = [0.0]
    tracker = ProgressTracker(1, 160, -1, clock=lambda: now[0])
    now[0] = 5.0
    assert tracker.add("public.t1", 10).eta_seconds is None  # was 5 s x 159 = 795 s
    now[0] = 5.1
    second = tracker.add("public.t2", 10)
    assert second.eta_seconds == pytest.approx(0.1 * 158) and "ETA 16s" in second.message()
    now[0] = 5.5  # by rows once the estimate exceeds what was read: 100 rows per 0.1 s
    tracker = ProgressTracker(1, 4, 1000, chunks_done=1, rows_done=250, clock=lambda: now[0])
    assert tracker.add("public.big", 250).metadata()["snapshot_eta_seconds"] == -1
    now[0] = 6.0
    assert tracker.add("public.big", 250).eta_seconds == pytest.approx(0.5 / 250 * 250)
    assert tracker.add("public.big", 250).eta_seconds == 0.0
