"""Asset checks: silver against the source, bronze LSN windows, schema drift, slot health.

* ``silver/<schema>/<table>`` ``matches_source``: live row count, key checksum and row
  checksum agree with the source at the LSN silver reached (keys changed since are left out
  and counted). Scans both sides: it runs in the ``capture_checks`` job (and on demand), not
  in every micro-batch. Holds the slot pool (it peeks the slot).
* ``silver/<schema>/<table>`` ``schema_matches_source``: the source's columns, typed as
  silver would type them, against the silver Delta schema.
* ``bronze/<schema>/<table>`` ``lsn_windows_contiguous``: bronze windows advance strictly,
  the runs that read the slot chain without a gap, and nothing else moved the slot.
* ``source/replication_slot`` ``slot_healthy``: ``wal_status``, lag, retained WAL and
  spill within the thresholds.

A check that cannot evaluate (source down, slot busy) reports a failed WARN result saying
why, so a micro-batch run never fails because of a check.
"""

# No ``from __future__ import annotations``: Dagster reads the resource annotations.

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import dagster as dg
import psycopg2
import pyarrow as pa
from deltalake.exceptions import DeltaError

from pgcdc_dagster.assets.keys import multi_check
from pgcdc_dagster.assets.naming import DEFAULT_NAMES, CaptureNames
from pgcdc_dagster.assets.run_ranges import RecentReads, SlotRuns, table_runs
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_capture
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.exceptions import PgCdcError
from pgcdc_dagster.names import display_name
from pgcdc_dagster.ops.consistency import ConsistencyReport, compare_tables
from pgcdc_dagster.ops.lsn_windows import (
    BronzeCommit,
    RunRange,
    WindowReport,
    check_commits,
    check_runs,
    last_snapshot,
)
from pgcdc_dagster.ops.schema_drift import compare_schemas, silver_schema_of
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.ops.slot_health import HEALTHY_WAL_STATUS, SlotHealth, slot_health
from pgcdc_dagster.ops.table_facts import CommitFacts, TableFacts, read_all_facts, read_facts
from pgcdc_dagster.postgres.connection import redact
from pgcdc_dagster.postgres.discovery import SkippedTable
from pgcdc_dagster.postgres.privileges import explain_error
from pgcdc_dagster.resources import CaptureResource, LakehouseResource, PostgresResource

MATCHES_SOURCE = "matches_source"
SCHEMA_MATCHES = "schema_matches_source"
LSN_WINDOWS = "lsn_windows_contiguous"
SLOT_HEALTHY = "slot_healthy"

EXPECTED_ERRORS = (PgCdcError, psycopg2.Error, DeltaError, OSError)

ERROR = dg.AssetCheckSeverity.ERROR
WARN = dg.AssetCheckSeverity.WARN


def matches_source_keys(tables: Sequence[tuple[str, str]],
                        names: CaptureNames = DEFAULT_NAMES) -> list[dg.AssetCheckKey]:
    return [dg.AssetCheckKey(names.silver(s, t), MATCHES_SOURCE) for s, t in tables]


def light_check_keys(tables: Sequence[tuple[str, str]],
                     names: CaptureNames = DEFAULT_NAMES) -> list[dg.AssetCheckKey]:
    """The checks cheap enough to run after every capture run."""
    return [
        *(dg.AssetCheckKey(names.bronze(s, t), LSN_WINDOWS) for s, t in tables),
        *(dg.AssetCheckKey(names.silver(s, t), SCHEMA_MATCHES) for s, t in tables),
        dg.AssetCheckKey(names.slot_key, SLOT_HEALTHY),
    ]


def _selected(context: dg.AssetCheckExecutionContext) -> list[dg.AssetCheckKey]:
    return sorted(context.selected_asset_check_keys, key=lambda k: k.to_user_string())




def not_evaluated(key: dg.AssetCheckKey, why: str) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(asset_key=key.asset_key, check_name=key.name, passed=False,
                               severity=WARN, description=f"check could not run: {why}",
                               metadata={"evaluated": False})


RunContexts = tuple[dict[tuple[str, str], TableContext], dict[tuple[str, str], SkippedTable]]
"""The captured tables' contexts and the matched tables left out (with why)."""

_RUN_CONTEXTS: dict[str, RunContexts] = {}
"""The contexts of the run in progress: the check steps of one run of the check definitions
(the UI's *Execute* of several checks; ``capture_checks`` is one op of its own,
``check_sweep.py``) load them once, not once per step."""


def _run_contexts(run_id: str, settings: CaptureSettings) -> RunContexts:
    cached = _RUN_CONTEXTS.get(run_id)
    if cached is None:
        captured, skipped = load_capture(settings)
        cached = ({c.relation.qualified: c for c in captured},
                  {(t.schema, t.table): t for t in skipped})
        _RUN_CONTEXTS.clear()  # one run at a time: the previous run's are not needed
        _RUN_CONTEXTS[run_id] = cached
    return cached


def _per_table(context: dg.AssetCheckExecutionContext, postgres: PostgresResource,
               lakehouse: LakehouseResource, capture: CaptureResource,
               evaluate: Callable[[dg.AssetCheckKey, TableContext], dg.AssetCheckResult],
               prepare: Callable[[Sequence[TableContext]], None] | None = None,
               names: CaptureNames = DEFAULT_NAMES) -> Iterator[dg.AssetCheckResult]:
    """Load the selected tables' contexts (once per run) and evaluate each selected check;
    ``prepare`` receives the contexts first (work done for all tables at once)."""
    keys = _selected(context)

    def _table(key: dg.AssetCheckKey) -> tuple[str, str]:
        return names.table_of(key.asset_key)

    try:
        settings = capture.settings(postgres.dsn, lakehouse.root)
        contexts, left_out = _run_contexts(context.op_execution_context.run_id, settings)
        if prepare is not None:
            wanted = {_table(k) for k in keys}
            prepare([c for t, c in contexts.items() if t in wanted])
    except EXPECTED_ERRORS as exc:
        for key in keys:
            yield not_evaluated(key, explain_error(exc, redact))
        return
    for key in keys:
        ctx = contexts.get(_table(key))
        if ctx is None:
            why = left_out.get(_table(key))  # e.g. SELECT revoked: the reason, the GRANT
            yield not_evaluated(key, why.describe() if why is not None else
                                 f"{display_name(*_table(key))} is no longer captured "
                                 "(dropped, or not matched by the include list)")
            continue
        try:
            yield evaluate(key, ctx)
        except EXPECTED_ERRORS as exc:
            yield not_evaluated(key, explain_error(exc, redact))


def evaluation(result: dg.AssetCheckResult) -> dg.AssetCheckEvaluation:
    """The evaluation event of a check result, for an op that is not the check's own (the
    lean jobs report the checks of the asset graph)."""
    assert result.asset_key is not None and result.check_name is not None
    return dg.AssetCheckEvaluation(
        asset_key=result.asset_key, check_name=result.check_name, passed=result.passed,
        metadata=result.metadata, severity=result.severity, description=result.description)


def _consistency_result(key: dg.AssetCheckKey, report: ConsistencyReport) -> dg.AssetCheckResult:
    meta: dict[str, Any] = {
        "compared": report.compared,
        "silver_lsn": str(report.silver_lsn),
        "source_lsn": str(report.source_lsn),
        "silver_version": -1 if report.silver_version is None else report.silver_version,
        "pending_events": report.pending_events,
        "excluded_keys": report.excluded_keys,
    }
    if report.compared:
        meta.update({
            "source_rows": report.source.rows,
            "silver_rows": report.silver.rows,
            "source_key_checksum": f"{report.source.key_checksum:016x}",
            "silver_key_checksum": f"{report.silver.key_checksum:016x}",
            "source_row_checksum": f"{report.source.row_checksum:016x}",
            "silver_row_checksum": f"{report.silver.row_checksum:016x}",
            "columns_compared": len(report.columns),
        })
        for label, sample in (("missing_in_silver", report.missing),
                              ("not_in_source", report.extra),
                              ("values_differ", report.different)):
            if sample:
                meta[label] = ", ".join(sample)
    if report.skipped_columns:
        meta["columns_not_compared"] = ", ".join(report.skipped_columns)
    return dg.AssetCheckResult(
        asset_key=key.asset_key, check_name=key.name, passed=report.ok,
        severity=ERROR if report.compared else WARN, description=report.describe(),
        metadata=meta)


def comparison_summary(reports: Sequence[ConsistencyReport]) -> str:
    """One log line for a comparison of many tables: how many match, and each difference."""
    differ = [r.describe() for r in reports if r.compared and not r.ok]
    return (f"{sum(r.ok for r in reports)} of {len(reports)} tables match the source, "
            f"{sum(not r.compared for r in reports)} not compared"
            + "".join(f"\n{d}" for d in differ))


def _windows_result(key: dg.AssetCheckKey, report: WindowReport,
                    confirmed: Lsn | None) -> dg.AssetCheckResult:
    meta: dict[str, Any] = {
        "bronze_commits_checked": report.commits,
        "runs_checked": report.runs,
        "last_window_end": str(report.last_window_end),
        "covered_from": str(report.covered_from),
        "covered_to": str(report.covered_to),
        "slot_confirmed_lsn": str(confirmed),
    }
    if report.problems:
        meta["problems"] = dg.MetadataValue.md("\n".join(f"- {p}" for p in report.problems))
    description = (f"{report.table}: no gap in LSN windows from {report.covered_from} to "
                   f"{report.covered_to}" if report.ok else
                   f"{report.table}: " + "; ".join(report.problems))
    return dg.AssetCheckResult(asset_key=key.asset_key, check_name=key.name, passed=report.ok,
                               severity=ERROR, description=description, metadata=meta)


def windows_result(key: dg.AssetCheckKey, ctx: TableContext, commits: Sequence[BronzeCommit],
                   bronze_applied: int | None, runs: Sequence[RunRange],
                   confirmed: Lsn | None) -> dg.AssetCheckResult:
    """``lsn_windows_contiguous`` of one table from its bronze capture commits and app
    transaction, the runs' ranges (:func:`~assets.run_ranges.table_runs`) and the slot's
    position (``confirmed``)."""
    report = WindowReport(ctx.name)
    check_commits(report, commits, bronze_applied)
    check_runs(report, runs, confirmed, last_snapshot(commits))
    return _windows_result(key, report, confirmed)


def schema_result(key: dg.AssetCheckKey, ctx: TableContext,
                  silver_schema: pa.Schema | None) -> dg.AssetCheckResult:
    """``schema_matches_source`` of one table (``silver_schema``: None when silver does not
    exist)."""
    report = compare_schemas(ctx.name, ctx.silver_schema, silver_schema)
    meta: dict[str, Any] = {
        "added": ", ".join(report.added), "removed": ", ".join(report.removed),
        "changed": ", ".join(f"{c}: {a} -> {b}" for c, a, b in report.changed)}
    return dg.AssetCheckResult(
        asset_key=key.asset_key, check_name=key.name, passed=report.ok,
        severity=ERROR if report.changed else WARN, description=report.describe(),
        metadata=meta)


def table_check_results(ctx: TableContext, facts: TableFacts | Exception,
                        runs: Sequence[RunRange], confirmed: Lsn | Exception | None,
                        consistency: ConsistencyReport | Exception | None = None,
                        names: CaptureNames = DEFAULT_NAMES) -> Iterator[dg.AssetCheckResult]:
    """The checks of one table from what was read for many at once: its Delta facts (or why
    they could not be read), its runs' ranges, the slot's position (or why it could not be
    read) and, in a sweep, its comparison with the source. A check that cannot evaluate
    reports why."""
    s, t = ctx.relation.qualified
    windows = dg.AssetCheckKey(names.bronze(s, t), LSN_WINDOWS)
    schema = dg.AssetCheckKey(names.silver(s, t), SCHEMA_MATCHES)
    matches = dg.AssetCheckKey(names.silver(s, t), MATCHES_SOURCE)
    keys = [windows, schema] + ([matches] if consistency is not None else [])
    if isinstance(facts, Exception):
        for key in keys:
            yield not_evaluated(key, explain_error(facts, redact))
        return
    if isinstance(confirmed, Exception):
        yield not_evaluated(windows, explain_error(confirmed, redact))
    else:
        yield _evaluated(windows, partial(windows_result, windows, ctx, facts.commits,
                                          facts.bronze_applied, runs, confirmed))
    yield _evaluated(schema, partial(schema_result, schema, ctx, facts.silver_schema))
    if isinstance(consistency, Exception):
        yield not_evaluated(matches, explain_error(consistency, redact))
    elif consistency is not None:
        yield _consistency_result(matches, consistency)


def _evaluated(key: dg.AssetCheckKey,
               evaluate: Callable[[], dg.AssetCheckResult]) -> dg.AssetCheckResult:
    try:
        return evaluate()
    except EXPECTED_ERRORS as exc:
        return not_evaluated(key, explain_error(exc, redact))


def light_check_facts(contexts: Sequence[TableContext], settings: MonitorSettings,
                      known: Mapping[str, CommitFacts] | None = None
                      ) -> list[TableFacts | Exception]:
    """What the light checks read from the tables' Delta logs (once each; a table that
    cannot be read gets why). ``known``: what the run's commits know, by table name
    (:func:`~assets.capture.committed_facts`): those tables are not read."""
    return read_all_facts(contexts, settings.history_limit, EXPECTED_ERRORS, known=known)


def light_check_results(instance: dg.DagsterInstance, contexts: Sequence[TableContext],
                        health: SlotHealth, settings: MonitorSettings, *, slot: bool = True,
                        facts: Sequence[TableFacts | Exception] | None = None,
                        observed: SlotRuns | None = None, recent: RecentReads | None = None,
                        names: CaptureNames = DEFAULT_NAMES) -> Iterator[dg.AssetCheckResult]:
    """The light checks of the given tables (a capture run passes the tables it changed)
    and, with ``slot``, of the slot; a check that cannot evaluate reports why, as in the
    check ops. The tables' Delta logs are read once each (``facts``: already read, by
    :func:`light_check_facts`), the runs' ranges in a few instance queries for all of them
    (``observed``: the slot's runs, ``recent``: what the run read before, see
    :func:`~assets.run_ranges.table_runs`)."""
    if slot:
        yield slot_result(health, settings, names)
    if not contexts:
        return
    if facts is None:
        facts = light_check_facts(contexts, settings)
    runs = table_runs(instance, [names.bronze(*c.relation.qualified) for c in contexts],
                      settings.history_limit, observed, recent, names.slot_key)
    for ctx, found in zip(contexts, facts, strict=True):
        yield from table_check_results(ctx, found, runs[names.bronze(*ctx.relation.qualified)],
                                       health.confirmed_flush_lsn, names=names)


def slot_result(health: SlotHealth, settings: MonitorSettings,
                names: CaptureNames = DEFAULT_NAMES) -> dg.AssetCheckResult:
    """``slot_healthy`` from the slot's health."""
    problems = health.problems(settings.slot)
    fatal = not health.exists or health.wal_status not in HEALTHY_WAL_STATUS
    meta: dict[str, Any] = {"exists": health.exists}
    if health.exists:
        meta.update({
            "wal_status": str(health.wal_status),
            "active": health.active,
            "confirmed_flush_lsn": str(health.confirmed_flush_lsn),
            "restart_lsn": str(health.restart_lsn),
            "lag_bytes": health.lag_bytes,
            "retained_bytes": health.retained_bytes,
            "safe_wal_size": -1 if health.safe_wal_size is None else health.safe_wal_size,
            "spill_txns": health.spill_txns,
            "spill_bytes": health.spill_bytes,
            "spill_ratio": round(health.spill_ratio, 4),
            "stream_txns": health.stream_txns,
            "total_bytes": health.total_bytes,
            "max_lag_bytes": settings.slot.max_lag_bytes,
            "max_retained_bytes": settings.slot.max_retained_bytes,
            "max_spill_ratio": settings.slot.max_spill_ratio,
        })
    description = (f"slot {health.name!r}: wal_status {health.wal_status}, lag "
                   f"{health.lag_bytes} bytes, retains {health.retained_bytes} bytes"
                   if not problems else f"slot {health.name!r}: " + "; ".join(problems))
    return dg.AssetCheckResult(asset_key=names.slot_key, check_name=SLOT_HEALTHY,
                               passed=not problems, severity=ERROR if fatal else WARN,
                               description=description, metadata=meta)


def build_asset_checks(tables: Sequence[tuple[str, str]], settings: MonitorSettings, *,
                       names: CaptureNames = DEFAULT_NAMES) -> list[dg.AssetChecksDefinition]:
    """The checks of the captured tables and of the slot."""
    checks: list[dg.AssetChecksDefinition] = []
    if tables:
        checks.extend(_table_checks(tables, settings, names))

    @dg.asset_check(asset=names.slot_key, name=SLOT_HEALTHY,
                    required_resource_keys=names.resource_keys,
                    description="The replication slot exists, its wal_status is reserved or "
                    "extended, and its lag, retained WAL and spill ratio are within the "
                    "thresholds (PGCDC_SLOT_MAX_LAG_BYTES, PGCDC_SLOT_MAX_RETAINED_BYTES, "
                    "PGCDC_SLOT_MAX_SPILL_RATIO).")
    def slot_healthy(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        key = dg.AssetCheckKey(names.slot_key, SLOT_HEALTHY)
        postgres, _, capture, _ = names.bound(context)
        try:
            return slot_result(slot_health(postgres.dsn, capture.slot), settings, names)
        except EXPECTED_ERRORS as exc:
            return not_evaluated(key, explain_error(exc, redact))

    checks.append(slot_healthy)
    return checks


def _table_checks(tables: Sequence[tuple[str, str]], settings: MonitorSettings,
                  names: CaptureNames) -> list[dg.AssetChecksDefinition]:
    keys = names.resource_keys

    @multi_check(
        name=names.scoped("silver_matches_source"), pool=names.pool, resource_keys=keys,
        specs=[dg.AssetCheckSpec(
            MATCHES_SOURCE, asset=names.silver(s, t),
            description=f"Live rows of silver {display_name(s, t)} agree with the source: row "
            "count, key checksum and row checksum, compared at the LSN silver reached (keys "
            "changed since are left out and counted).") for s, t in tables])
    def silver_matches_source(context: dg.AssetCheckExecutionContext
                              ) -> Iterator[dg.AssetCheckResult]:
        postgres, lakehouse, capture, _ = names.bound(context)
        reports: dict[str, ConsistencyReport] = {}

        def compare(contexts: Sequence[TableContext]) -> None:
            # one slot lock, source snapshot and peek for every table of the sweep
            found = compare_tables(postgres.dsn, contexts, capture.slot, capture.publication,
                                   max_pending_bytes=settings.max_pending_bytes)
            reports.update({c.name: r for c, r in zip(contexts, found, strict=True)})
            context.log.info(comparison_summary(found))

        def evaluate(key: dg.AssetCheckKey, ctx: TableContext) -> dg.AssetCheckResult:
            return _consistency_result(key, reports[ctx.name])

        yield from _per_table(context, postgres, lakehouse, capture, evaluate, compare, names)

    @multi_check(
        name=names.scoped("silver_schema_matches_source"), resource_keys=keys,
        specs=[dg.AssetCheckSpec(
            SCHEMA_MATCHES, asset=names.silver(s, t),
            description=f"The columns of {display_name(s, t)} in the source, typed as silver "
            "types them, equal the silver Delta schema (added/dropped columns warn, a type "
            "change is an error).") for s, t in tables])
    def silver_schema_matches_source(context: dg.AssetCheckExecutionContext
                                     ) -> Iterator[dg.AssetCheckResult]:
        postgres, lakehouse, capture, _ = names.bound(context)

        def evaluate(key: dg.AssetCheckKey, ctx: TableContext) -> dg.AssetCheckResult:
            return schema_result(key, ctx, silver_schema_of(ctx.silver_uri))

        yield from _per_table(context, postgres, lakehouse, capture, evaluate, names=names)

    @multi_check(
        name=names.scoped("bronze_lsn_windows"), pool=names.pool, resource_keys=keys,
        specs=[dg.AssetCheckSpec(
            LSN_WINDOWS, asset=names.bronze(s, t),
            description=f"Bronze {display_name(s, t)} has no gap or overlap in LSN windows: "
            "window ends advance strictly after the snapshot, the app transaction names the "
            "last one, the capture runs chain end to start, and the slot is where the last run "
            "left it.") for s, t in tables])
    def bronze_lsn_windows(context: dg.AssetCheckExecutionContext
                           ) -> Iterator[dg.AssetCheckResult]:
        postgres, lakehouse, capture, _ = names.bound(context)
        confirmed: list[Lsn | None] = []
        runs: dict[dg.AssetKey, list[RunRange]] = {}

        def prepare(contexts: Sequence[TableContext]) -> None:
            # the slot's position and the runs' ranges, read once for every selected table
            confirmed.append(slot_health(postgres.dsn, capture.slot).confirmed_flush_lsn)
            runs.update(table_runs(context.instance,
                                   [names.bronze(*c.relation.qualified) for c in contexts],
                                   settings.history_limit, slot_key=names.slot_key))

        def evaluate(key: dg.AssetCheckKey, ctx: TableContext) -> dg.AssetCheckResult:
            facts = read_facts(ctx, settings.history_limit)
            return windows_result(key, ctx, facts.commits, facts.bronze_applied,
                                  runs[key.asset_key], confirmed[0])

        yield from _per_table(context, postgres, lakehouse, capture, evaluate, prepare, names)

    return [silver_matches_source, silver_schema_matches_source, bronze_lsn_windows]
