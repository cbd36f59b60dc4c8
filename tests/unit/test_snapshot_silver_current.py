"""After a snapshot, the silver catch-up skips only the tables it has nothing for.

The snapshot commit creates silver at bronze's version (``silver_current``); a capture run
then reports those tables' silver as caught up without opening either table again, unless
a window of the same run wrote to the table's bronze after the snapshot, or the commit
found bronze ahead of the snapshot's version (a table that existed before).
"""

from __future__ import annotations

from pgcdc_dagster.capture.captured import CapturedTables
from pgcdc_dagster.capture.runner import BronzeRun
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import SnapshotReport, TableSnapshotReport
from pgcdc_dagster.capture.stream import StreamReport, WindowReport
from pgcdc_dagster.cdc.lsn import Lsn


def test_only_tables_the_snapshot_left_current_and_no_window_touched() -> None:
    snapshot = SnapshotReport(True, Lsn(100), tables=[
        TableSnapshotReport("s.fresh", 10, 1, 0, 0, 100, silver_current=True),
        TableSnapshotReport("s.streamed", 5, 1, 0, 0, 100, silver_current=True),
        TableSnapshotReport("s.older", 5, 1, 3, 2, 100, silver_current=False),
    ])
    assert snapshot.table("s.older") is snapshot.tables[2] and snapshot.table("s.x") is None
    stream = StreamReport(Lsn(100), Lsn(200), windows=[
        WindowReport(Lsn(100), Lsn(200), 1, 1, {"s.streamed": {"u": 1}}, 0.1)])
    run = BronzeRun(CapturedTables(CaptureSettings(dsn="", lakehouse=""), []), [],
                    snapshot=snapshot, stream=stream)
    current = run.current_silver()
    assert list(current) == ["s.fresh"]
    report = current["s.fresh"]
    # what the catch-up itself reports for a silver already at bronze's version
    assert (report.table, report.bronze_from, report.bronze_to) == ("s.fresh", 0, 0)
    assert (report.events, report.rows, report.counts, report.silver_version) == (0, 0, {}, 0)
    assert BronzeRun(run.tables, [], stream=stream).current_silver() == {}
