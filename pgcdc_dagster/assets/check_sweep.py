"""The ``capture_checks`` job: every check of every captured table, in one op.

An asset job selecting every asset check would write one ``ASSET_CHECK_EVALUATION_PLANNED``
event per check when the run is created, before any work, and run each check kind as its
own step with its own reads. ``capture_checks`` is instead an op job of a single
``check_sweep`` op (pool ``pgcdc_slot``: it peeks the slot) that

* loads the captured tables' contexts once (one catalog read);
* reads each table's bronze and silver Delta logs once, on a few threads
  (:mod:`pgcdc_dagster.ops.table_facts`);
* compares every table with the source under one slot lock, one source snapshot and one
  peek (:func:`~pgcdc_dagster.ops.consistency.compare_tables`);
* reads the capture runs' LSN ranges for every table in a few instance queries
  (:mod:`assets.run_ranges`);
* reports ``matches_source`` and ``schema_matches_source`` of each silver table,
  ``lsn_windows_contiguous`` of each bronze table and ``slot_healthy`` as
  ``AssetCheckEvaluation`` events of those asset checks: the same check keys, results and
  metadata as the check definitions, which stay in the asset graph for the UI's *Execute*.

What is left grows with the table count: each table's Delta logs and rows (the comparison
reads both sides in full) and one evaluation event per check, written by Dagster's event
storage (docs/operations.md, *The checks sweep*).
"""

# No ``from __future__ import annotations``: Dagster reads the resource annotations.

import time
from collections.abc import Iterator, Sequence

import dagster as dg

from pgcdc_dagster.assets.checks import (
    EXPECTED_ERRORS,
    LSN_WINDOWS,
    MATCHES_SOURCE,
    SCHEMA_MATCHES,
    SLOT_HEALTHY,
    comparison_summary,
    evaluation,
    not_evaluated,
    slot_result,
    table_check_results,
)
from pgcdc_dagster.assets.naming import DEFAULT_NAMES, CaptureNames
from pgcdc_dagster.assets.run_ranges import table_runs
from pgcdc_dagster.capture.snapshot import load_capture
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.names import display_name
from pgcdc_dagster.ops.consistency import ConsistencyReport, compare_tables
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.ops.slot_health import slot_health
from pgcdc_dagster.ops.table_facts import TableFacts, read_all_facts
from pgcdc_dagster.postgres.connection import redact
from pgcdc_dagster.postgres.privileges import explain_error

SWEEP_OP = "check_sweep"


def table_keys(schema: str, table: str,
               names: CaptureNames = DEFAULT_NAMES) -> list[dg.AssetCheckKey]:
    """The checks of one table the sweep reports."""
    return [dg.AssetCheckKey(names.silver(schema, table), MATCHES_SOURCE),
            dg.AssetCheckKey(names.silver(schema, table), SCHEMA_MATCHES),
            dg.AssetCheckKey(names.bronze(schema, table), LSN_WINDOWS)]


def sweep_keys(tables: Sequence[tuple[str, str]],
               names: CaptureNames = DEFAULT_NAMES) -> list[dg.AssetCheckKey]:
    """Every check key the sweep reports: three per table and the slot's."""
    return [*(k for s, t in tables for k in table_keys(s, t, names)),
            dg.AssetCheckKey(names.slot_key, SLOT_HEALTHY)]


class _Timer:
    """Seconds per phase of the sweep, for its closing log line."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def describe(self) -> str:
        return ", ".join(f"{k} {v:.2f} s" for k, v in self.phases.items())


def build_checks_job(name: str, tables: Sequence[tuple[str, str]],
                     settings: MonitorSettings, *, description: str,
                     tags: dict[str, str], names: CaptureNames = DEFAULT_NAMES
                     ) -> dg.JobDefinition:
    """The ``capture_checks`` op job over ``tables``."""
    swept = list(tables)

    @dg.op(name=names.scoped(SWEEP_OP), pool=names.pool, required_resource_keys=names.resource_keys,
           description="Every check of every captured table and of the slot: silver against "
           "the source (one slot lock, snapshot and peek for all), schema drift, bronze LSN "
           "windows, slot health; reported as asset check evaluations.")
    def check_sweep(context: dg.OpExecutionContext) -> None:
        sweep(context)

    def sweep(context: dg.OpExecutionContext) -> None:
        postgres, lakehouse, capture, _ = names.bound(context)
        timer = _Timer()
        written = 0

        def report(results: Iterator[dg.AssetCheckResult]) -> None:
            nonlocal written
            for result in results:
                # log_event records check evaluations too (its annotation lists the others)
                context.log_event(evaluation(result))  # type: ignore[arg-type]
                written += 1
            timer.lap("evaluations written")

        confirmed: Lsn | Exception | None
        try:
            health = slot_health(postgres.dsn, capture.slot)
            confirmed = health.confirmed_flush_lsn
            report(iter([slot_result(health, settings, names)]))
        except EXPECTED_ERRORS as exc:
            confirmed = exc
            report(iter([not_evaluated(dg.AssetCheckKey(names.slot_key, SLOT_HEALTHY),
                                       explain_error(exc, redact))]))
        timer.lap("slot")
        try:
            captured, skipped = load_capture(capture.settings(postgres.dsn, lakehouse.root))
        except EXPECTED_ERRORS as exc:  # source unreachable: no check of a table can run
            why = explain_error(exc, redact)
            report(not_evaluated(k, why) for s, t in swept for k in table_keys(s, t, names))
            return
        contexts = {c.relation.qualified: c for c in captured}
        left_out = {(t.schema, t.table): t for t in skipped}
        present = [contexts[t] for t in swept if t in contexts]
        timer.lap("catalog")
        facts = read_all_facts(present, settings.history_limit, EXPECTED_ERRORS)
        readable = [(c, f) for c, f in zip(present, facts, strict=True)
                    if isinstance(f, TableFacts)]
        timer.lap("Delta logs")
        consistency: dict[str, ConsistencyReport | Exception]
        try:  # one slot lock, source snapshot and peek for every table of the sweep
            compared = compare_tables(postgres.dsn, [c for c, _ in readable], capture.slot,
                                      capture.publication,
                                      max_pending_bytes=settings.max_pending_bytes,
                                      facts=[f for _, f in readable])
            consistency = {c.name: r for (c, _), r in zip(readable, compared, strict=True)}
            context.log.info(comparison_summary(compared))
        except EXPECTED_ERRORS as exc:  # e.g. no REPLICATION to peek: every table says why
            consistency = {c.name: exc for c, _ in readable}
        timer.lap("comparison")
        runs = table_runs(context.instance, [names.bronze(*c.relation.qualified)
                                             for c in present], settings.history_limit,
                          slot_key=names.slot_key)
        timer.lap("run ranges")

        def results() -> Iterator[dg.AssetCheckResult]:
            for s, t in swept:
                ctx: TableContext | None = contexts.get((s, t))
                if ctx is None:
                    why = left_out.get((s, t))  # e.g. SELECT revoked: the reason and the GRANT
                    reason = why.describe() if why is not None else (
                        f"{display_name(s, t)} is no longer captured (dropped, or not "
                        "matched by the include list)")
                    yield from (not_evaluated(k, reason) for k in table_keys(s, t, names))
                    continue
                found = facts_of[ctx.name]
                if isinstance(found, Exception):  # its Delta logs could not be read
                    error = explain_error(found, redact)
                    yield from (not_evaluated(k, error) for k in table_keys(s, t, names))
                    continue
                yield from table_check_results(ctx, found, runs[names.bronze(s, t)], confirmed,
                                               consistency[ctx.name], names)

        facts_of = {c.name: f for c, f in zip(present, facts, strict=True)}
        report(results())
        context.log.info(f"{written} check evaluations of {len(present)} tables: "
                         f"{timer.describe()}")

    @dg.job(name=name, description=description, executor_def=dg.in_process_executor,
            tags=tags)
    def checks_job() -> None:
        check_sweep()

    return checks_job
