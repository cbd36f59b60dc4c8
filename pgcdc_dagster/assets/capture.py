"""Bronze and silver assets, one of each per captured table, and their materialization metadata.

The assets are specs: one execution model writes them, the capture op of the
``initial_snapshot`` and ``cdc_microbatch`` jobs (``capture_run.py``, pool ``pgcdc_slot`` of
size 1), which owns the slot, writes bronze then silver, and reports a materialization of each
table it changed (``incremental/snapshot`` reports those of the tables it re-read).

Every materialization carries the numbers the UI plots over time: capture kind, LSN range,
events by op, rows and bytes written, duration, rows/s, slot lag, Delta version, and the
table's column schema (``dagster/column_schema``).
"""

# No ``from __future__ import annotations`` here: Dagster reads the config and resource
# annotations of the asset functions at definition time.

from collections.abc import Sequence
from typing import Any

import dagster as dg
import pyarrow as pa
from pydantic import Field

from pgcdc_dagster.assets.naming import DEFAULT_NAMES, CaptureNames
from pgcdc_dagster.capture.bronze_write import internal_events_key
from pgcdc_dagster.capture.runner import BronzeRun
from pgcdc_dagster.capture.silver_apply import SilverReport
from pgcdc_dagster.capture.snapshot import SnapshotReport
from pgcdc_dagster.capture.stream import StreamReport
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.lake.silver import META_NAMES
from pgcdc_dagster.names import display_name
from pgcdc_dagster.ops.delta_stats import TableStats, growth, live_row_count, table_stats
from pgcdc_dagster.ops.lsn_windows import BronzeCommit, bronze_commits
from pgcdc_dagster.ops.schema_drift import normalise_type
from pgcdc_dagster.ops.slot_health import SlotHealth
from pgcdc_dagster.ops.table_facts import CommitFacts
from pgcdc_dagster.postgres.discovery import SkippedTable

CAPTURE_POOL = DEFAULT_NAMES.pool
"""Concurrency pool around everything that reads the slot; give it a limit of 1 (a named
capture's is ``<name>_pgcdc_slot``: :attr:`CaptureNames.pool`)."""

DEFAULT_OWNERS = ("team:pgcdc",)

SILVER_META_DOC = {
    "__op": "Debezium op of the change that produced the row: r snapshot, c, u, d",
    "__lsn": "LSN of that change (Debezium source.lsn)",
    "__commit_lsn": "commit LSN of its transaction (sequence, part 1: greatest wins)",
    "__ordinal": "position of the change in its transaction (sequence, part 2)",
    "__source_ts_ms": "commit time in the source, ms since the epoch (source.ts_ms)",
    "__deleted": "tombstone: the key was deleted; read live rows WHERE NOT __deleted",
}
BRONZE_DOC = {
    "key": "the event's key (primary-key columns, Debezium literal types)",
    "before": "row image before the change (d, u with REPLICA IDENTITY FULL or key change)",
    "after": "row image after the change (r, c, u)",
    "source": "Debezium source block: version, connector, name, ts_ms, snapshot, db, "
              "sequence, schema, table, txId, lsn, xmin",
    "op": "r snapshot read, c create, u update, d delete, t truncate",
    "ts_ms": "when the event was processed, ms since the epoch",
    "transaction": "id, total_order, data_collection_order",
    "__commit_lsn": "commit LSN of the transaction (sequence, part 1)",
    "__ordinal": "position of the event in its transaction (sequence, part 2)",
    "__toast_unchanged": "columns whose value was unchanged TOAST (not sent by pgoutput)",
}


META_TABLES = {
    "messages": "Logical decoding messages (pg_logical_emit_message) of the captured database, "
                "op m, in Debezium's message envelope (prefix, content); the project's own "
                "watermarks and heartbeats are left out.",
    "transactions": "Transaction metadata (provide.transaction.metadata): one BEGIN and one END "
                    "record per captured transaction, with its event counts per table.",
}
"""The capture-wide bronze tables under ``<lakehouse>/bronze/_pgcdc``."""


def meta_key(name: str) -> dg.AssetKey:
    return DEFAULT_NAMES.meta_key(name)


def slot_spec(names: CaptureNames = DEFAULT_NAMES) -> dg.AssetSpec:
    """The replication slot every bronze asset reads (health check and lag observations)."""
    return dg.AssetSpec(
        names.slot_key, group_name=names.scoped("source"), kinds={"postgres"},
        owners=list(names.owners), tags={"pgcdc/layer": "source"},
        description="The logical replication slot (pgoutput) and its publication: the "
        "position up to which the source's changes are in bronze. Its checks and "
        "observations show the lag, the WAL it retains and its wal_status.",
    )


def source_specs(tables: Sequence[tuple[str, str]],
                 names: CaptureNames = DEFAULT_NAMES) -> list[dg.AssetSpec]:
    """The source tables (external assets, lineage roots) and the replication slot."""
    return [names.spec("source", s, t) for s, t in tables] + [slot_spec(names)]


class BronzeConfig(dg.Config):
    """Run configuration of the bronze step."""

    snapshot_step: bool = Field(
        default=False,
        description="Check for (and take) the initial snapshot before streaming, even when "
        "the slot exists (the initial_snapshot job sets it).",
    )


def _column(field: pa.Field, description: str, *, key: bool = False) -> dg.TableColumn:
    return dg.TableColumn(
        name=field.name, type=normalise_type(field.type), description=description,
        constraints=dg.TableColumnConstraints(
            nullable=field.nullable and not key, unique=False,
            other=["primary key"] if key else []),
    )


def silver_column_schema(ctx: TableContext) -> dg.TableSchema:
    """Silver columns: the source columns in native types, then the metadata columns."""
    keys = set(ctx.relation.key_names)
    columns = []
    for field in ctx.silver_schema:
        if field.name in META_NAMES:
            columns.append(_column(field, SILVER_META_DOC.get(field.name, "")))
            continue
        meta = {k.decode(): v.decode() for k, v in (field.metadata or {}).items()}
        pg_type = meta.get("pg.type", "")
        columns.append(_column(field, f"source type {pg_type}" if pg_type else "",
                               key=field.name in keys))
    return dg.TableSchema(columns=columns)


def bronze_column_schema(ctx: TableContext) -> dg.TableSchema:
    """Bronze columns: the Debezium envelope plus the sequence columns."""
    return dg.TableSchema(columns=[_column(f, BRONZE_DOC.get(f.name, ""))
                                   for f in ctx.bronze_schema])


def skipped_metadata(skipped: Sequence[SkippedTable]) -> dict[str, Any]:
    """``skipped_tables``: the matched tables the run left out, with the reason and fix."""
    meta: dict[str, Any] = {"skipped_tables_count": len(skipped)}
    if skipped:
        meta["skipped_tables"] = dg.MetadataValue.md(
            "\n".join(f"- {t.describe()}" for t in skipped))
    return meta


def _rate(rows: int, seconds: float) -> float:
    return round(rows / seconds, 1) if seconds > 0 else 0.0


def _slot_meta(health: SlotHealth | None) -> dict[str, Any]:
    if health is None or not health.exists:
        return {}
    return {"slot_lag_bytes": health.lag_bytes, "slot_retained_bytes": health.retained_bytes,
            "wal_status": str(health.wal_status)}


NEW_CHAIN_SLOT_ACTIONS = ("create", "recreate", "create_plain")
"""Snapshots that created the slot: the LSN-window chain starts again at their point. A
snapshot read through a temporary slot (tables added later, ``always``) leaves the slot where
it was, so its point is recorded as ``snapshot_point`` only, never as ``snapshot_lsn``."""


def _snapshot_metadata(snap: SnapshotReport, name: str) -> dict[str, Any]:
    """The snapshot part of a bronze table's metadata."""
    point = str(snap.consistent_point)
    meta: dict[str, Any] = {"snapshot_mode": snap.mode, "slot_action": snap.slot_action,
                            "snapshot_point": point,
                            "snapshot_chunks_read": snap.chunks_read,
                            "snapshot_resumed_chunks_total": snap.resumed_chunks}
    if snap.slot_action in NEW_CHAIN_SLOT_ACTIONS:
        meta["snapshot_lsn"] = point
    t = snap.table(name)
    if t is not None:
        meta.update({"snapshot_rows": t.rows, "snapshot_chunks": t.chunks,
                     "snapshot_resumed_chunks": t.resumed_chunks,
                     "snapshot_table_lsn": str(Lsn(t.lsn))})
    if name in snap.empty_tables:
        meta["snapshot_rows"] = 0
        meta["snapshot_without_data"] = True
    if snap.last_progress is not None:
        meta.update(snap.last_progress.metadata())
        meta["snapshot_progress"] = (f"{snap.last_progress.chunks_done}/"
                                     f"{snap.last_progress.chunks_total} chunks")
    return meta


def _bronze_metadata(run: BronzeRun, ctx: TableContext, before: TableStats, seconds: float,
                     health: SlotHealth | None) -> dict[str, Any]:
    name = ctx.name
    meta: dict[str, Any] = {}
    kinds = []
    events = dict.fromkeys("rcudt", 0)
    if run.snapshot is not None and run.snapshot.performed:
        kinds.append("snapshot")
        meta.update(_snapshot_metadata(run.snapshot, name))
        events["r"] = int(meta.get("snapshot_rows", 0))
    if run.stream is not None:
        kinds.append("stream")
        for op, n in run.stream.events_by_table().get(name, {}).items():
            events[op] = events.get(op, 0) + n
        meta["lsn_start"] = str(run.stream.start)
        meta["lsn_end"] = str(run.stream.end)
        meta["windows"] = len(run.stream.windows)
        meta["slot_lag_bytes"] = run.stream.slot_lag_bytes
        meta["slot_retained_bytes"] = run.stream.slot_retained_bytes
        meta["wal_status"] = str(run.stream.wal_status)
    else:
        meta.update(_slot_meta(health))
    meta["capture_kind"] = "+".join(kinds) or "none"
    for op, n in events.items():
        meta[f"events_{op}"] = n
    total = sum(events.values())
    # A table the snapshot's commit created, with no window since: its files are known.
    snapped = run.snapshot.table(name) if run.snapshot is not None and run.stream is None \
        else None
    after = snapped.bronze_stats if snapped is not None and snapped.bronze_stats is not None \
        else table_stats(ctx.bronze_uri)
    added = growth(before, after, ctx.bronze_uri)
    meta.update({
        "source_table": display_name(*ctx.relation.qualified),
        "events": total,
        "rows_written": added.rows,
        "bytes_written": added.bytes,
        "files_written": added.files,
        "duration_s": round(seconds, 3),
        "rows_per_s": _rate(total, seconds),
        "dagster/row_count": after.rows,
        "table_bytes": after.bytes,
        "dagster/column_schema": bronze_column_schema(ctx),
        "dagster/uri": ctx.bronze_uri,
        "table_uri": dg.MetadataValue.path(ctx.bronze_uri),
    })
    if after.version is not None:
        meta["delta_version"] = after.version
    return meta


def meta_table_metadata(stream: StreamReport | None, name: str, uri: str,
                        before: TableStats, seconds: float) -> dict[str, Any]:
    """Metadata of ``bronze/_pgcdc/<name>`` after a run."""
    counts = stream.events_by_table().get(internal_events_key(name), {}) \
        if stream is not None else {}
    events = sum(counts.values())
    after = table_stats(uri)
    added = growth(before, after, uri)
    meta: dict[str, Any] = {"capture_kind": "stream" if stream is not None else "none",
                            "events": events, "rows_written": added.rows,
                            "bytes_written": added.bytes, "files_written": added.files,
                            "duration_s": round(seconds, 3), "rows_per_s": _rate(events, seconds),
                            "dagster/row_count": after.rows, "table_bytes": after.bytes,
                            "dagster/uri": uri}
    if stream is not None and stream.start is not None:
        meta.update({"lsn_start": str(stream.start), "lsn_end": str(stream.end),
                     "slot_lag_bytes": stream.slot_lag_bytes})
    if after.version is not None:
        meta["delta_version"] = after.version
    return meta


def _silver_metadata(report: SilverReport, ctx: TableContext, before: TableStats,
                     bronze_from: int | None, health: SlotHealth | None,
                     snapshot: TableStats | None = None,
                     commits: Sequence[BronzeCommit] | None = None) -> dict[str, Any]:
    """Metadata of one silver materialization; ``bronze_from`` is the bronze version the
    previous materialization had applied (None: this is the first). ``snapshot``: silver as
    the snapshot's commit just created or replaced it (every row live), not read back;
    ``commits``: bronze's capture commits when known (the snapshot commit created bronze),
    not read back."""
    after = snapshot if snapshot is not None else table_stats(ctx.silver_uri)
    added = growth(before, after, ctx.silver_uri)
    if commits is None:
        commits, _ = bronze_commits(ctx.bronze_uri)
    earlier = [c for c in commits if bronze_from is not None and c.version <= bronze_from]
    applied = [c for c in commits if (bronze_from is None or c.version > bronze_from)
               and c.version <= report.bronze_to]
    kinds = [k for k in ("snapshot", "stream") if any(c.kind == k for c in applied)]
    counts = report.counts
    meta: dict[str, Any] = {
        "source_table": display_name(*ctx.relation.qualified),
        "capture_kind": "+".join(kinds) or "none",
        "bronze_version_from": -1 if report.bronze_from is None else report.bronze_from,
        "bronze_version_to": report.bronze_to,
        "events": report.events,
        "rows_merged": report.rows,
        "inserted": counts.get("inserted", 0),
        "updated": counts.get("updated", 0),
        "deleted_by_truncate": counts.get("deleted_by_truncate", 0),
        "files_rewritten": counts.get("files_removed", 0),
        "files_read": counts.get("files_read", 0),
        "bytes_removed": counts.get("bytes_removed", 0),
        "delta_version": report.silver_version,
        "duration_s": round(report.seconds, 3),
        "rows_per_s": _rate(report.rows, report.seconds),
        "rows_written": added.rows,
        "bytes_written": added.bytes,
        "files_written": added.files,
        "table_bytes": after.bytes,
        "dagster/row_count": snapshot.rows if snapshot is not None else
        live_row_count(ctx.silver_uri) or 0,
        "dagster/column_schema": silver_column_schema(ctx),
        "dagster/uri": ctx.silver_uri,
        "table_uri": dg.MetadataValue.path(ctx.silver_uri),
        **_slot_meta(health),
    }
    if applied:
        meta["lsn_start"] = str(earlier[-1].end if earlier else applied[0].end)
        meta["lsn_end"] = str(applied[-1].end)
    return meta


def committed_facts(run: BronzeRun) -> dict[str, CommitFacts]:
    """What the run's snapshot commits know of the tables they created, by table name, while
    no window has written since (then the light checks and reports need not read the logs
    back)."""
    if run.snapshot is None or run.stream is not None:
        return {}
    return {t.table: t.facts for t in run.snapshot.tables}


def build_capture_assets(tables: Sequence[tuple[str, str]],
                         names: CaptureNames = DEFAULT_NAMES) -> list[dg.AssetSpec]:
    """The bronze and silver assets of the given ``(schema, table)`` pairs, and the
    capture-wide bronze tables: asset specs, each written by the capture op only
    (``capture_run.py``: ``initial_snapshot``, ``cdc_microbatch``), which reports a
    materialization for each table a run changed. Their lineage: source table and slot →
    bronze → silver. Each table's spec is the translator's
    (:class:`~pgcdc_dagster.assets.translator.PgcdcTranslator`)."""
    specs = []
    for s, t in tables:
        b_key = names.bronze(s, t)
        specs.append(names.spec("bronze", s, t).replace_attributes(
            deps=[names.source(s, t), names.slot_key]))
        specs.append(names.spec("silver", s, t).replace_attributes(deps=[b_key]))
    for meta_name, text in META_TABLES.items():
        specs.append(dg.AssetSpec(
            names.meta_key(meta_name), deps=[names.slot_key],
            group_name=names.scoped("bronze"), kinds={"postgres", "delta"},
            owners=list(names.owners), tags={"pgcdc/layer": "bronze"},
            description=f"{text} Append-only Delta at <lakehouse>/bronze/_pgcdc/{meta_name}, "
            "written with the windows of the bronze tables (exactly once)."))
    return specs


def _previous(instance: dg.DagsterInstance, key: dg.AssetKey) -> tuple[int | None, int | None]:
    """Delta version and bronze version applied (silver), as the previous materialization
    recorded them (None, None for the first one)."""
    return recorded_versions(instance.get_latest_materialization_event(key))


def previous_of(instance: dg.DagsterInstance, keys: Sequence[dg.AssetKey]
                ) -> dict[dg.AssetKey, tuple[int | None, int | None]]:
    """:func:`_previous` of many assets, read in one query."""
    events = instance.get_latest_materialization_events(keys) if keys else {}
    return {key: recorded_versions(events.get(key)) for key in keys}


def recorded_versions(event: dg.EventLogEntry | None) -> tuple[int | None, int | None]:
    """Delta version and bronze version applied, as a materialization recorded them."""
    if event is None or event.asset_materialization is None:
        return None, None
    meta = event.asset_materialization.metadata
    values = [meta.get(name) for name in ("delta_version", "bronze_version_to")]
    out = [v.value if v is not None and isinstance(v.value, int) else None for v in values]
    return out[0], out[1]
