"""Bronze LSN windows: every WAL range between the snapshot and the slot was read, once.

Two records are compared:

* the bronze table's Delta history: each capture commit carries ``pgcdc.kind`` (``snapshot``
  with ``pgcdc.lsn``, or ``stream`` with ``pgcdc.window_end`` and, when the engine records it,
  ``pgcdc.window_start``), and the table's app transaction holds the last window end;
* the runs that read the slot (each covers ``(start, end]``, consecutive runs must chain),
  and the slot's confirmed position now.

A table gets a bronze commit only for windows that hold events of that table, so its commits
alone cannot prove coverage; the run chain does, and the commits must fit in it: window ends
strictly increase after the snapshot (no window twice), the app transaction names the last
one, runs start exactly where the previous one ended, and the slot has not been moved past
the last run by anything else. (A bronze commit past the last recorded run is legitimate: a
run that failed between its bronze commit and the slot advance; the next run skips it.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from deltalake import DeltaTable

from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.lake.delta import open_table


@dataclass(frozen=True, slots=True)
class BronzeCommit:
    """One capture commit of a bronze table."""

    version: int
    kind: str
    """``snapshot`` or ``stream``."""
    end: Lsn
    """Window end (stream) or the snapshot's consistent point (snapshot)."""
    start: Lsn | None = None
    """Window start when the engine recorded it (``pgcdc.window_start``)."""


@dataclass(frozen=True, slots=True)
class RunRange:
    """What one capture run covered, as its materialization recorded it."""

    label: str
    """Run id (or any label) to name in reports."""
    snapshot_lsn: Lsn | None
    """Consistent point of a snapshot the run took (starts a new chain)."""
    start: Lsn | None
    end: Lsn | None
    """``(start, end]`` read from the slot; None when the run did not stream."""


@dataclass
class WindowReport:
    """Outcome of the gap check of one bronze table."""

    table: str
    commits: int = 0
    runs: int = 0
    last_window_end: Lsn | None = None
    covered_from: Lsn | None = None
    covered_to: Lsn | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _lsn(value: object) -> Lsn | None:
    if value is None or value == "":
        return None
    try:
        return Lsn.parse(str(value))
    except ValueError:
        return None


def bronze_commits(uri: str, limit: int = 200) -> tuple[list[BronzeCommit], int | None]:
    """The capture commits among the last ``limit`` (oldest first), and the table version."""
    table = open_table(uri)
    if table is None:
        return [], None
    return capture_commits(table, limit), table.version()


def capture_commits(table: DeltaTable, limit: int = 200) -> list[BronzeCommit]:
    """The capture commits among the last ``limit`` of an opened bronze table, oldest
    first."""
    commits = []
    for entry in table.history(limit):
        kind = entry.get("pgcdc.kind")
        if kind == "snapshot":
            end = _lsn(entry.get("pgcdc.lsn"))
        elif kind == "stream":
            end = _lsn(entry.get("pgcdc.window_end"))
        else:
            continue
        if end is None:
            continue
        commits.append(BronzeCommit(int(entry["version"]), str(kind), end,
                                    _lsn(entry.get("pgcdc.window_start"))))
    commits.sort(key=lambda c: c.version)
    return commits


def check_commits(report: WindowReport, commits: Sequence[BronzeCommit],
                  app_version: int | None) -> None:
    """Window ends strictly increase after each snapshot; the app transaction is the last."""
    report.commits = len(commits)
    previous: BronzeCommit | None = None
    for commit in commits:
        if commit.kind == "stream" and previous is not None:
            if commit.end <= previous.end:
                report.problems.append(
                    f"bronze version {commit.version}: window ending at {commit.end} does not "
                    f"advance past {previous.end} (version {previous.version}): a window was "
                    "written twice or out of order")
            # After a snapshot the window may start below its point: a snapshot taken on a
            # temporary slot (a table added later, an interrupted snapshot resumed) is newer
            # than the slot, and the stream drops the table's events up to the point.
            if (commit.start is not None and previous.kind == "stream"
                    and commit.start < previous.end):
                report.problems.append(
                    f"bronze version {commit.version}: window ({commit.start}, {commit.end}] "
                    f"overlaps the previous one ending at {previous.end}")
        previous = commit
    if previous is not None:
        report.last_window_end = previous.end
        if app_version is not None and app_version != int(previous.end):
            report.problems.append(
                f"the bronze app transaction records {Lsn(app_version)} but the last capture "
                f"commit (version {previous.version}) ends at {previous.end}")


def last_snapshot(commits: Sequence[BronzeCommit]) -> Lsn | None:
    """The point of the table's latest snapshot commit (``commits`` oldest first)."""
    return next((c.end for c in reversed(commits) if c.kind == "snapshot"), None)


def check_runs(report: WindowReport, runs: Sequence[RunRange],
               slot_confirmed: Lsn | None, snapshot: Lsn | None = None) -> None:
    """Consecutive runs chain, and the slot is where the last run left it.

    ``runs`` are oldest first. ``snapshot``: the point of the table's own latest snapshot
    (:func:`last_snapshot`): WAL up to it needs no run, the snapshot read the table as of it.
    A table that joined the capture later was snapshotted on its own (a temporary slot):
    the runs before it that did not write it (an incremental snapshot, an asset-job run of
    the tables captured then) left no range on it, and are no gap of its.
    """
    report.runs = len(runs)
    position: Lsn | None = None
    for run in runs:
        if run.snapshot_lsn is not None:
            position = run.snapshot_lsn
            report.covered_from = run.snapshot_lsn
        if run.start is None or run.end is None:
            continue
        if position is None:
            report.covered_from = run.start
        elif run.start > position and (snapshot is None or run.start > snapshot):
            read_to = position if snapshot is None else max(position, snapshot)
            report.problems.append(
                f"WAL ({read_to}, {run.start}] was never read: run {run.label} started at "
                f"{run.start} but the previous run ended at {position} (the slot was advanced "
                "outside the pipeline, or recreated without a snapshot); changes in that range "
                "are missing from bronze: re-snapshot the tables")
        elif run.start < position:
            report.problems.append(
                f"run {run.label} started at {run.start}, before the previous run's end "
                f"{position}: the slot went backwards (was it recreated?)")
        position = run.end
    report.covered_to = position
    if slot_confirmed is not None and position is not None and slot_confirmed != position:
        if slot_confirmed > position:
            report.problems.append(
                f"the slot is confirmed at {slot_confirmed} but the last run ended at "
                f"{position}: WAL ({position}, {slot_confirmed}] was consumed outside the "
                "pipeline and its changes are missing from bronze")
        else:
            report.problems.append(
                f"the slot is confirmed at {slot_confirmed}, behind the last run's end "
                f"{position}: the slot was recreated or moved back")
