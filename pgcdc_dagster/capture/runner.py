"""One capture run as the Dagster assets drive it: snapshot when needed, windows, silver."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pgcdc_dagster.capture.faults import crash_point
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.silver_apply import SilverReport, apply_silver
from pgcdc_dagster.capture.snapshot import SnapshotReport, load_contexts, run_initial_snapshot
from pgcdc_dagster.capture.stream import StreamReport, run_windows
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.discovery import current_database
from pgcdc_dagster.postgres.slot import slot_info

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SNAPSHOT_MODES = ("initial", "initial_only", "no_data", "never", "always", "when_needed")


@dataclass
class BronzeRun:
    """What the bronze step did."""

    contexts: list[TableContext]
    snapshot: SnapshotReport | None = None
    stream: StreamReport | None = None
    notes: list[str] = field(default_factory=list)


def select_contexts(settings: CaptureSettings,
                    only: Collection[tuple[str, str]] | None) -> list[TableContext]:
    """Contexts of the captured tables, restricted to ``only`` when given."""
    contexts = load_contexts(settings)
    if only is None:
        return contexts
    return [c for c in contexts if c.relation.qualified in only]


def run_bronze(settings: CaptureSettings, spark: SparkSession, *, force_snapshot_step: bool,
               only: Collection[tuple[str, str]] | None = None,
               progress: Callable[[str], None] = log.info) -> BronzeRun:
    """Snapshot if ``snapshot.mode`` asks for one, then read windows into bronze."""
    if settings.snapshot_mode not in SNAPSHOT_MODES:
        raise ConfigurationError(
            f"snapshot.mode = {settings.snapshot_mode!r} is not supported; use one of "
            f"{', '.join(SNAPSHOT_MODES)}")
    contexts = select_contexts(settings, only)
    run = BronzeRun(contexts)
    with connection(settings.dsn) as conn:
        slot = slot_info(conn, settings.slot)
    wants_snapshot = settings.snapshot_mode in ("initial", "initial_only", "always",
                                                "when_needed")
    if slot is None and wants_snapshot:
        progress(f"no slot {settings.slot!r}: taking the initial snapshot")
        run.snapshot = run_initial_snapshot(settings, spark)
        progress(f"snapshot: {run.snapshot.rows} rows from {len(run.snapshot.tables)} tables "
                 f"at {run.snapshot.consistent_point} in {run.snapshot.seconds:.1f}s")
    elif slot is None:
        raise ConfigurationError(
            f"slot {settings.slot!r} does not exist and snapshot.mode = "
            f"{settings.snapshot_mode}; run the initial_snapshot job with snapshot.mode "
            "initial to create it.")
    elif force_snapshot_step:
        run.snapshot = run_initial_snapshot(settings, spark)
        if not run.snapshot.performed:
            run.notes.append(run.snapshot.reason)
    if settings.snapshot_mode == "initial_only":
        run.notes.append("snapshot.mode = initial_only: no streaming")
        return run
    with connection(settings.dsn) as conn:
        ident = SourceIdentity(settings.topic_prefix, current_database(conn))
    run.stream = run_windows(settings, contexts, ident)
    progress(f"stream: {len(run.stream.windows)} windows, {run.stream.start} -> "
             f"{run.stream.end}, slot lag {run.stream.slot_lag_bytes} bytes")
    return run


def run_silver(settings: CaptureSettings, spark: SparkSession,
               only: Collection[tuple[str, str]] | None = None) -> list[SilverReport]:
    """Catch every selected table's silver up with its bronze."""
    reports = []
    for ctx in select_contexts(settings, only):
        reports.append(apply_silver(ctx, spark))
        crash_point("after_silver_merge")
    return reports
