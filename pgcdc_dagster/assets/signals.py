"""Incremental-snapshot signals in Dagster: the signal-table sensor and the signal job.

``signal_table_sensor`` polls the Debezium-style signalling table (``signal.data.collection``,
columns ``id``, ``type``, ``data``) and applies each new row through
:func:`~pgcdc_dagster.capture.incremental.apply_signal`:

* ``execute-snapshot`` records the snapshot (its ``additional-conditions`` and
  ``surrogate-key`` are checked here) and requests one ``incremental_snapshot`` run per
  matched table (its partition), run key = the signal id (``<id>:<partition>`` when the
  signal names several tables), tag ``pgcdc/signal_id``;
* ``pause-snapshot`` and ``stop-snapshot`` take effect at the running run's next chunk;
  ``resume-snapshot`` requests a run for each resumed table;
* ``log`` is logged.

A malformed or refused signal is logged as a warning and skipped; it never stops the sensor.
The cursor holds the ids already applied (only those still in the table, so it stays as
small as the table) and the last one seen.

``incremental_snapshot_signal`` is the Dagster channel for the same signals: a job whose run
config carries ``type`` and ``data`` (Debezium's JSON payload).
"""

# No ``from __future__ import annotations``: Dagster reads the config/resource annotations.

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import dagster as dg
import psycopg2
from pydantic import Field

from pgcdc_dagster.assets.incremental import SIGNAL_TAG, AssetJob
from pgcdc_dagster.assets.naming import DEFAULT_NAMES, CaptureNames
from pgcdc_dagster.assets.partitions import missing_partitions, partition_key
from pgcdc_dagster.capture.incremental import SignalOutcome, apply_signal
from pgcdc_dagster.cdc.dblog import Signal, SignalError, parse_signal
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.names import parse_table_id, table_id
from pgcdc_dagster.postgres.signals import SignalRow, read_signals
from pgcdc_dagster.resources import CaptureResource

SIGNAL_SENSOR = "signal_table_sensor"
SIGNAL_JOB = "incremental_snapshot_signal"


@dataclass
class SignalCursor:
    """Signals already applied (ids still present in the table) and the last one."""

    seen: list[str] = field(default_factory=list)
    last: str | None = None

    @classmethod
    def parse(cls, raw: str | None) -> "SignalCursor":
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
            return cls([str(i) for i in data.get("seen", [])], data.get("last"))
        except (ValueError, AttributeError):
            return cls()

    def dump(self) -> str:
        return json.dumps({"seen": self.seen, "last": self.last}, sort_keys=True)


@dataclass
class SignalTick:
    """What one evaluation did."""

    run_requests: list[dg.RunRequest] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    cursor: SignalCursor = field(default_factory=SignalCursor)


def _table(name: str, captured: Mapping[str, tuple[str, str]]) -> tuple[str, str] | None:
    """The ``(schema, table)`` of an outcome's table (its :func:`table_id`)."""
    if name in captured:
        return captured[name]
    try:
        return parse_table_id(name)
    except ValueError:
        return None


def _requests(row: SignalRow, outcome: SignalOutcome,
              captured: Mapping[str, tuple[str, str]]) -> list[dg.RunRequest]:
    pairs = [_table(t, captured) for t in outcome.tables]
    keys = [partition_key(*pair) for pair in pairs if pair is not None]
    return [dg.RunRequest(run_key=row.id if len(keys) == 1 else f"{row.id}:{key}",
                          partition_key=key,
                          tags={SIGNAL_TAG: row.id, "pgcdc/trigger": SIGNAL_SENSOR,
                                "pgcdc/signal_type": row.type})
            for key in keys]


def evaluate_signals(rows: Sequence[SignalRow], cursor: SignalCursor,
                     apply: Callable[[Signal], SignalOutcome],
                     captured: Sequence[tuple[str, str]] = ()) -> SignalTick:
    """Apply the rows not in the cursor, in order; a bad one is refused, not fatal."""
    by_name = {table_id(s, t): (s, t) for s, t in captured}
    tick = SignalTick()
    seen = set(cursor.seen)
    present = []
    for row in rows:
        present.append(row.id)
        if row.id in seen:
            continue
        seen.add(row.id)
        try:
            outcome = apply(parse_signal(row.id, row.type, row.data))
        except (SignalError, ConfigurationError) as exc:
            tick.refused.append(f"signal {row.id!r} ({row.type}) refused: {exc}")
            continue
        tick.applied.append(f"signal {row.id!r} ({row.type}): {outcome.note}"
                            + (f" [{', '.join(outcome.tables)}]" if outcome.tables else ""))
        if row.type in ("execute-snapshot", "resume-snapshot"):
            tick.run_requests += _requests(row, outcome, by_name)
    last = rows[-1].id if rows else cursor.last
    tick.cursor = SignalCursor([i for i in present if i in seen], last)
    return tick


class ApplyFn:
    """``apply_signal`` bound to one capture's settings."""

    def __init__(self, capture: CaptureResource, dsn: str, lakehouse: str) -> None:
        self.settings = capture.settings(dsn, lakehouse)

    def __call__(self, signal: Signal) -> SignalOutcome:
        return apply_signal(self.settings, signal)


def build_signal_sensor(tables: Sequence[tuple[str, str]],
                        job: AssetJob, *,
                        names: CaptureNames = DEFAULT_NAMES) -> dg.SensorDefinition:
    """The signal-table sensor launching ``incremental_snapshot`` runs."""
    captured = list(tables)

    @dg.sensor(
        name=names.scoped(SIGNAL_SENSOR), job=job, minimum_interval_seconds=30,
        required_resource_keys=names.resource_keys,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Apply new rows of the signalling table (signal.data.collection, "
        "PGCDC_SIGNAL_DATA_COLLECTION): execute-snapshot and resume-snapshot launch "
        "incremental_snapshot runs (run key = signal id), pause/stop take effect at the "
        "running snapshot's next chunk. Malformed signals are reported and skipped.")
    def signal_table_sensor(context: dg.SensorEvaluationContext,
                            **_direct: object) -> dg.SensorResult:
        # a direct call (sensor(context)) passes the resources as keywords too
        postgres, lakehouse, capture, _ = names.bound(context)
        add = missing_partitions(context.instance, captured, names)
        partitions = [names.partitions.build_add_request(add)] if add else []
        cursor = SignalCursor.parse(context.cursor)
        if not capture.signal_data_collection.strip():
            return dg.SensorResult(
                skip_reason="signal.data.collection (PGCDC_SIGNAL_DATA_COLLECTION) is not set",
                dynamic_partitions_requests=partitions, cursor=context.cursor)
        try:
            with postgres.get_connection() as conn:
                rows = read_signals(conn, capture.signal_data_collection)
        except (psycopg2.Error, ConfigurationError) as exc:
            message = (getattr(exc, "pgerror", None) or str(exc)).strip().splitlines()[0]
            return dg.SensorResult(
                skip_reason=f"cannot read the signalling table "
                f"{capture.signal_data_collection!r}: {message}",
                dynamic_partitions_requests=partitions, cursor=context.cursor)
        tick = evaluate_signals(rows, cursor, ApplyFn(capture, postgres.dsn, lakehouse.root),
                                captured)
        for line in tick.applied:
            context.log.info(line)
        for line in tick.refused:
            context.log.warning(line)
        if not tick.run_requests:
            notes = tick.applied + tick.refused
            return dg.SensorResult(
                skip_reason="; ".join(notes) if notes else "no new signal",
                dynamic_partitions_requests=partitions, cursor=tick.cursor.dump())
        return dg.SensorResult(run_requests=tick.run_requests, cursor=tick.cursor.dump(),
                               dynamic_partitions_requests=partitions)

    return signal_table_sensor


class SignalConfig(dg.Config):
    """A signal sent through Dagster (same names and payloads as the signalling table)."""

    id: str = Field(default="", description="Signal id (default: the run id).")
    type: str = Field(description="execute-snapshot, stop-snapshot, pause-snapshot, "
                      "resume-snapshot or log.")
    data: str = Field(default="", description="Debezium's JSON payload, e.g. "
                      '{"data-collections": ["public.orders"]}.')


def build_signal_job(names: CaptureNames = DEFAULT_NAMES) -> dg.JobDefinition:
    """The job that sends a signal through Dagster."""

    @dg.op(name=names.scoped("apply_incremental_signal"), tags={"pgcdc/operation": "signal"},
           required_resource_keys=names.resource_keys,
           description="Apply one incremental-snapshot signal (Dagster channel).")
    def apply_incremental_signal(context: dg.OpExecutionContext, config: SignalConfig) -> None:
        _apply(context, config, names)

    @dg.job(name=names.scoped(SIGNAL_JOB), executor_def=dg.in_process_executor,
            tags={"pgcdc/job": SIGNAL_JOB,
                  **({"pgcdc/capture": names.name} if names.name else {})},
            description="Send an incremental-snapshot signal through Dagster "
            "(execute-snapshot, stop-snapshot, pause-snapshot, resume-snapshot, log).")
    def signal_job() -> None:
        apply_incremental_signal()

    return signal_job


def _apply(context: dg.OpExecutionContext, config: SignalConfig, names: CaptureNames) -> None:
    postgres, lakehouse, capture, _ = names.bound(context)
    signal_id = config.id or context.run_id
    try:
        outcome = ApplyFn(capture, postgres.dsn, lakehouse.root)(
            parse_signal(signal_id, config.type, config.data))
    except (SignalError, ConfigurationError) as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    context.log.info(f"signal {signal_id} ({config.type}): {outcome.note}"
                     + (f" [{', '.join(outcome.tables)}]" if outcome.tables else ""))
    if config.type == "execute-snapshot" and outcome.tables:
        context.log.info("launch incremental_snapshot for these partitions (or backfill) to "
                         "run the snapshot")


signal_job = build_signal_job()
