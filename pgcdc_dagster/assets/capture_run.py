"""The lean capture jobs: one op that captures, and reports only the tables it changed.

``cdc_microbatch`` and ``initial_snapshot`` are op jobs of a single ``capture`` op (pool
``pgcdc_slot``). An asset job would plan every selected table's bronze, silver and checks at
run creation (one ``ASSET_MATERIALIZATION_PLANNED`` / ``ASSET_CHECK_EVALUATION_PLANNED``
event each), so an idle micro-batch over 1,000 tables would write thousands of events before
any work. The op instead reports, at run time:

* an ``AssetMaterialization`` of ``bronze/<schema>/<table>`` and ``silver/<schema>/<table>``
  for each table the run changed, with the same metadata as the assets (capture kind, LSN
  range, events by op, rows, bytes, Delta version, column schema): they appear in each
  asset's history and metadata plots (this op is the only writer of these assets);
* the light checks (``lsn_windows_contiguous``, ``schema_matches_source``) of those tables
  and ``slot_healthy``, as ``AssetCheckEvaluation`` events of the asset checks;
* one observation of ``source/replication_slot`` with the run's LSN range, whatever it
  changed, before the rest of the run's reports (as soon as the bronze step has moved the
  slot): the LSN-window check chains the runs from it.

The tables a snapshot commits are reported as each batch of them is committed, while Spark
reads the others: the bronze step runs on a thread of its own (:func:`_bronze_in_thread`) and
hands its log lines and committed tables to the op's thread, which writes every Dagster
event; the stream starts only once they are all reported, and reports a table again only for
what it wrote to it. The slot's observation comes when the bronze step has ended.

Every table's silver catches up once when the run before did not leave every silver caught up
(it failed, or it was an incremental-snapshot run): see
:func:`_silver_may_lag`.
"""

# No ``from __future__ import annotations`` here: Dagster reads the config and resource
# annotations of the op function at definition time.

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dagster as dg

from pgcdc_dagster.assets.capture import (
    META_TABLES,
    BronzeConfig,
    _bronze_metadata,
    _silver_metadata,
    committed_facts,
    meta_table_metadata,
    previous_of,
    skipped_metadata,
)
from pgcdc_dagster.assets.checks import evaluation, light_check_facts, light_check_results
from pgcdc_dagster.assets.naming import DEFAULT_NAMES, Bound, CaptureNames
from pgcdc_dagster.assets.partitions import ensure_partitions
from pgcdc_dagster.assets.run_ranges import (
    CAPTURE_RUN,
    RecentReads,
    SlotRuns,
    slot_runs,
    with_running,
)
from pgcdc_dagster.assets.slot_hold import SLOT_LOCK_TAG, hold_slot_for_run
from pgcdc_dagster.capture.bronze_write import internal_events_key
from pgcdc_dagster.capture.runner import BronzeRun
from pgcdc_dagster.capture.silver_apply import SilverReport
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.lake.delta import shared_reads
from pgcdc_dagster.ops.delta_stats import TableStats, table_stats
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.ops.slot_health import SlotHealth, slot_health
from pgcdc_dagster.postgres.discovery import Resolution
from pgcdc_dagster.postgres.slot_lock import SlotLease, lease_lent

CAPTURE_OP = "capture"
BRONZE_WRITING_JOBS = ("cdc_microbatch", "initial_snapshot", "incremental_snapshot")
"""Jobs that write bronze (``pgcdc/job`` tag values; a run that took the slot lock carries the
slot-lock tag too)."""
LEAN_JOBS = ("cdc_microbatch", "initial_snapshot")
"""The jobs of the capture op: they leave every silver caught up when they succeed."""
_RECENT_RUNS = 50
METADATA_THREADS = 2
"""Threads reading the changed tables' materialization metadata while the op thread writes
the events (an event write waits on the instance's storage, a metadata read on Delta logs)."""


def _silver_may_lag(instance: dg.DagsterInstance, run_id: str,
                    names: CaptureNames = DEFAULT_NAMES) -> bool:
    """True unless the last run before this one that wrote bronze was a lean capture run that
    succeeded: after a failed run (a crash between a bronze commit and the silver MERGE) or
    an incremental snapshot (which catches up only its own tables' silver), every silver
    catches up once.
    A few run records are read, whatever the table count; a named capture's own only."""
    only = dg.RunsFilter(tags={"pgcdc/capture": names.name}) if names.name else None
    lean = {names.scoped(job) for job in LEAN_JOBS}
    for run in instance.get_runs(only, limit=_RECENT_RUNS):
        if run.run_id == run_id:
            continue
        if run.tags.get(SLOT_LOCK_TAG) is None and \
                run.tags.get("pgcdc/job") not in BRONZE_WRITING_JOBS:
            continue  # checks, maintenance, signals: no bronze written
        return not (run.job_name in lean and run.status == dg.DagsterRunStatus.SUCCESS)
    return True  # none recent: be safe


def _before(version: int | None, uri: str) -> TableStats:
    """The table as its previous materialization (its Delta ``version``) left it (nothing
    before the first)."""
    return table_stats(uri, version) if version is not None else TableStats(None)


def _run_range(run: BronzeRun) -> dict[str, Any]:
    meta: dict[str, Any] = {CAPTURE_RUN: True}
    snap = run.snapshot
    if snap is not None and snap.performed and snap.consistent_point is not None:
        meta["snapshot_point"] = str(snap.consistent_point)
        if snap.slot_action in ("create", "recreate", "create_plain"):
            meta["snapshot_lsn"] = str(snap.consistent_point)
    if run.stream is not None and run.stream.start is not None:
        meta.update({"lsn_start": str(run.stream.start), "lsn_end": str(run.stream.end),
                     "windows": len(run.stream.windows),
                     "slot_lag_bytes": run.stream.slot_lag_bytes})
    return meta


def build_capture_op(tables: Sequence[tuple[str, str]], settings: MonitorSettings, *,
                     names: CaptureNames = DEFAULT_NAMES) -> dg.OpDefinition:
    """The ``capture`` op over ``tables`` (one definition, shared by the capture jobs)."""
    captured = list(tables)

    @dg.op(name=names.scoped(CAPTURE_OP), pool=names.pool,
           required_resource_keys=names.resource_keys,
           description="Snapshot when snapshot.mode asks for it, read bounded slot windows "
           "into bronze (exactly once), merge the changed tables' silver, advance the slot; "
           "report materializations and light checks of the tables changed.")
    def capture_op(context: dg.OpExecutionContext, config: BronzeConfig) -> None:
        run_capture(context, config)

    def run_capture(context: dg.OpExecutionContext, config: BronzeConfig) -> None:
        postgres, lakehouse, capture, spark = names.bound(context)
        lease = hold_slot_for_run(context, capture, postgres.dsn)  # one reader, whole run
        if not captured:  # loaded while the source did not answer (assets/catalog.py)
            raise dg.Failure(f"the definitions capture no table: the code location was loaded "
                             f"while the source ({postgres.describe()}) could not be read and "
                             "no catalog was cached; reload the code location",
                             allow_retries=False)
        instance = context.instance
        run_context = names.run_context(  # what the engine needs, once per run
            Bound(postgres, lakehouse, capture, spark), context.run_id, captured)
        ensure_partitions(instance, captured, names)  # incremental-snapshot backfills
        sweep = _silver_may_lag(instance, context.run_id, names)
        started = time.monotonic()
        reporter = _Reporter(context, settings, lakehouse.internal, names)
        recent = RecentReads()  # the early reports' look-back, read once across batches

        def early(part: BronzeRun) -> None:
            """A batch of snapshot tables committed: report them while the step goes on."""
            changed, current = part.changed(), part.current_silver()
            # The light checks chain this run by its range so far (its observation is
            # written when the bronze step ends), not by these tables' materializations.
            observed = with_running(slot_runs(instance, settings.history_limit,
                                              names.slot_key),
                                    context.run_id, _run_range(part))
            reporter.report(part, changed, [(c, current.get(c.name)) for c in changed],
                            slot_health(postgres.dsn, capture.slot),
                            time.monotonic() - started, observed=observed, recent=recent)
            reporter.early.update(c.name for c in changed)

        run = _bronze_in_thread(
            context, lease, lambda progress, committed, settled: run_context.bronze(
                force_snapshot_step=config.snapshot_step, progress=progress,
                on_committed=committed, after_snapshot=settled), early)
        seconds = time.monotonic() - started
        for note in run.notes:
            context.log.info(note)
        if run.skipped:
            context.log.warning(Resolution(skipped=run.skipped).warning())
        if len(set(run.names)) < len(set(captured)):
            have = set(run.names)
            gone = [f"{s}.{t}" for s, t in captured if (s, t) not in have]
            raise dg.Failure(f"{', '.join(gone)} no longer captured (dropped, or no longer "
                             "matched by the include list): reload the code location")
        changed = run.changed()
        health = slot_health(postgres.dsn, capture.slot)
        # The run's LSN range first: the slot has moved, so the range must be on record even
        # when the run dies or fails later (reporting tables, merging silver); otherwise
        # lsn_windows_contiguous finds a "never read" gap in every table the run left alone.
        context.log_event(dg.AssetObservation(asset_key=names.slot_key, metadata={
            **_run_range(run), "tables_changed": len(changed),
            "tables_captured": len(run.names), "duration_s": round(seconds, 3),
            "lag_bytes": health.lag_bytes, "wal_status": str(health.wal_status),
            **skipped_metadata(run.skipped)}))
        # Tables reported as their snapshot was committed: again only for what the stream
        # wrote to them after it (their snapshot part is on record).
        streamed = run.stream.events_by_table() if run.stream is not None else {}
        left = [c for c in changed if c.name not in reporter.early or c.name in streamed]
        changed_names = {c.name for c in changed}
        # Only the catch-up sweep builds (opens) every table; a regular run only the changed.
        silver_of = left + [c for c in run.contexts if c.name not in changed_names] if sweep \
            else left
        if len(silver_of) > len(left):  # the catch-up sweep (one event, not per run)
            context.log.info(f"silver of {len(silver_of)} tables "
                             f"({len(left)} changed by this run)")
        # Tables the snapshot just committed, silver and all, have nothing to catch up.
        current = run.current_silver()
        behind = [c for c in silver_of if c.name not in current]
        caught_up = dict(zip([c.name for c in behind], run_context.silver(behind), strict=True))
        left_names = {c.name for c in left}
        silver = [(ctx, report) for ctx, report in (
            (c, current.get(c.name) or caught_up[c.name]) for c in silver_of)
            if ctx.name in left_names or report.events != 0 or
            report.bronze_from != report.bronze_to]  # swept with nothing: no event
        reporter.report(run, left, silver, health, seconds, meta_tables=True)

    return capture_op


_Work = Callable[[Callable[[str], None], Callable[[BronzeRun], None], Callable[[], None]],
                 BronzeRun]
"""The bronze step, given its progress, ``on_committed`` and ``after_snapshot`` hooks."""


def _bronze_in_thread(context: dg.OpExecutionContext, lease: SlotLease, work: _Work,
                      early: Callable[[BronzeRun], None]) -> BronzeRun:
    """Run the bronze step (``work``) on a thread of its own, under the op's slot lease,
    while this thread writes its log lines and reports (``early``) the snapshot tables it
    commits as Dagster events: the events of tables already committed are stored while
    Spark reads the others. When the snapshot has ended, the step waits until they are all
    reported before it reads any window (what the stream commits, or a slot it moves, must
    not show in a snapshot table's report or light checks). Dagster events are written from
    this thread only. The step's error is raised here as it was raised there; an error here
    (or the run's termination) stops the step at its next report."""
    items: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    stop = threading.Event()

    def put(kind: str, value: Any) -> None:
        if stop.is_set():
            raise dg.Failure("the capture op stopped while its bronze step ran")
        items.put((kind, value))

    def settled() -> None:
        reported = threading.Event()
        put("settle", reported)
        while not reported.wait(0.5):
            put("wait", None)  # raises once this thread's reporting stopped

    def step() -> BronzeRun:
        with lease_lent(lease):
            return work(lambda line: put("log", line), lambda part: put("tables", part),
                        settled)

    with ThreadPoolExecutor(1, thread_name_prefix="pgcdc-bronze") as pool:
        future = pool.submit(step)
        future.add_done_callback(lambda _: items.put(("end", None)))
        try:
            while True:
                kind, value = items.get()
                if kind == "end":
                    break
                if kind == "log":
                    context.log.info(value)
                elif kind == "settle":
                    value.set()
                elif kind == "tables":
                    early(value)
        except BaseException:
            stop.set()
            raise
        return future.result()


class _Reporter:
    """Writes a capture run's materializations and light checks (from the op's thread)."""

    def __init__(self, context: dg.OpExecutionContext, settings: MonitorSettings,
                 internal: Callable[[str], str], names: CaptureNames = DEFAULT_NAMES) -> None:
        self.context = context
        self.names = names
        self.settings = settings
        self.internal = internal
        """The URI of a capture-wide bronze table (``LakehouseResource.internal``)."""
        self.early: set[str] = set()
        """Tables reported as their snapshot was committed."""

    def report(self, run: BronzeRun, changed: Sequence[TableContext],
               silver: Sequence[tuple[TableContext, SilverReport | None]],
               health: SlotHealth, seconds: float, *, observed: SlotRuns | None = None,
               recent: RecentReads | None = None, meta_tables: bool = False) -> None:
        """Bronze materializations of ``changed``, silver of ``silver`` (the tables whose
        report is None are left for the run's catch-up), the light checks of ``changed``
        and, at the run's end (no ``observed``: the runs' ranges the slot's observations
        hold, this run's included), the slot's. A table reported earlier in the run is
        reported for its stream part only (its snapshot part is on record)."""
        context, instance = self.context, self.context.instance
        with ThreadPoolExecutor(1, thread_name_prefix="pgcdc-facts") as facts_pool:
            # the checks' Delta log reads while the materializations are written
            facts = facts_pool.submit(light_check_facts, changed, self.settings,
                                      committed_facts(run))
            self._materializations(run, changed, silver, health, seconds, meta_tables)
            with shared_reads():
                for result in light_check_results(
                        instance, changed, health, self.settings, slot=observed is None,
                        facts=facts.result(), observed=observed, recent=recent,
                        names=self.names):
                    # log_event records check evaluations too (its annotation lists the
                    # others only)
                    context.log_event(evaluation(result))  # type: ignore[arg-type]

    def _materializations(self, run: BronzeRun, changed: Sequence[TableContext],
                          silver: Sequence[tuple[TableContext, SilverReport | None]],
                          health: SlotHealth, seconds: float, meta_tables: bool) -> None:
        context, instance = self.context, self.context.instance
        stream_only = dataclasses.replace(run, snapshot=None)
        bronze_key, silver_key = self.names.bronze, self.names.silver
        bronze_before = previous_of(instance, [bronze_key(*c.relation.qualified)
                                               for c in changed])

        def bronze_event(ctx: TableContext) -> dg.AssetMaterialization:
            key = bronze_key(*ctx.relation.qualified)
            with shared_reads():  # each table opened once for its metadata
                before = _before(bronze_before[key][0], ctx.bronze_uri)
                return dg.AssetMaterialization(asset_key=key, metadata={
                    **_bronze_metadata(stream_only if ctx.name in self.early else run,
                                       ctx, before, seconds,
                                       None if run.stream is not None else health),
                    **skipped_metadata(run.skipped)})

        # The tables' metadata is read, and each event built, by worker threads while this
        # one writes the events.
        with ThreadPoolExecutor(METADATA_THREADS, thread_name_prefix="pgcdc-meta") as pool:
            for event in pool.map(bronze_event, changed):
                context.log_event(event)
        if meta_tables:
            self._meta_tables(run, seconds)
        applied = [(ctx, r) for ctx, r in silver if r is not None]
        silver_before = previous_of(instance, [silver_key(*c.relation.qualified)
                                               for c, _ in applied])

        def silver_event(item: tuple[TableContext, SilverReport]) -> dg.AssetMaterialization:
            ctx, report = item
            key = silver_key(*ctx.relation.qualified)
            version, bronze_from = silver_before[key]
            # silver as the snapshot's commit left it, when nothing was applied since
            snapped = run.snapshot.table(ctx.name) if run.snapshot is not None and \
                run.stream is None and report.events == 0 else None
            created = snapped.facts.bronze if snapped is not None else None
            with shared_reads():
                known = snapped.silver_stats if snapped is not None else None
                return dg.AssetMaterialization(asset_key=key, metadata=_silver_metadata(
                    report, ctx, _before(version, ctx.silver_uri), bronze_from, health,
                    known if known is not None and known.version == report.silver_version
                    else None, created.commits if created is not None else None))

        with ThreadPoolExecutor(METADATA_THREADS, thread_name_prefix="pgcdc-meta") as pool:
            for event in pool.map(silver_event, applied):
                context.log_event(event)

    def _meta_tables(self, run: BronzeRun, seconds: float) -> None:
        """``bronze/_pgcdc/*`` of the tables the run's windows wrote."""
        instance = self.context.instance
        with shared_reads():
            meta_events = run.stream.events_by_table() if run.stream is not None else {}
            for meta_name in META_TABLES:
                if internal_events_key(meta_name) not in meta_events:
                    continue
                key = self.names.meta_key(meta_name)
                uri = self.internal(meta_name)
                self.context.log_event(dg.AssetMaterialization(asset_key=key, metadata=(
                    meta_table_metadata(run.stream, meta_name, uri,
                                        _before(previous_of(instance, [key])[key][0], uri),
                                        seconds))))


def build_capture_job(name: str, op: dg.OpDefinition, *, snapshot_step: bool,
                      description: str, names: CaptureNames = DEFAULT_NAMES
                      ) -> dg.JobDefinition:
    """A lean capture job (``cdc_microbatch`` or ``initial_snapshot``) of the capture op."""
    run_config: dict[str, Any] = {"ops": {names.scoped(CAPTURE_OP): {"config": {
        "snapshot_step": True}}}} \
        if snapshot_step else {}

    @dg.job(name=names.scoped(name), description=description, config=run_config,
            executor_def=dg.in_process_executor,
            tags={"pgcdc/job": name, **({"pgcdc/capture": names.name} if names.name else {})})
    def capture_job() -> None:
        op()

    return capture_job
