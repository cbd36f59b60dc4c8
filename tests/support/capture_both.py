"""Capture one table by snapshot AND by stream through the real pipeline, for type tests.

Rows present before the run are captured by the initial snapshot (``op = r``); afterwards a
copy of every row with ``id + 1000`` is inserted and captured by the stream (``op = c``);
then silver catches up. The caller compares bronze and silver with PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.typeconv import TypeModes

STREAM_OFFSET = 1000


@dataclass
class Captured:
    """Bronze ``after`` images by original id, for the snapshot and the streamed copies."""

    settings: CaptureSettings
    ctx: TableContext
    snapshot: dict[int, dict[str, Any]]
    stream: dict[int, dict[str, Any]]

    @property
    def images(self) -> list[tuple[str, dict[int, dict[str, Any]]]]:
        return [("snapshot", self.snapshot), ("stream", self.stream)]


def settings_for(dsn: str, lakehouse: Any, table: str, modes: TypeModes,
                 slot: str = "typecap") -> CaptureSettings:
    return CaptureSettings(dsn=dsn, lakehouse=str(lakehouse), include=(f"public\\.{table}",),
                           slot=slot, publication=slot, modes=modes)


def capture_both(dsn: str, conn: Any, spark: Any, lakehouse: Any, table: str,
                 modes: TypeModes, slot: str = "typecap") -> Captured:
    """Snapshot ``table`` (key ``id``), stream copies of its rows, apply silver."""
    settings = settings_for(dsn, lakehouse, table, modes, slot)
    run_bronze(settings, spark, force_snapshot_step=True)
    with conn.cursor() as cur:
        cur.execute(f"SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) "
                    f"FROM pg_attribute WHERE attrelid = 'public.{table}'::regclass "
                    f"AND attnum > 0 AND NOT attisdropped AND attname <> 'id'")
        cols = cur.fetchone()[0]
        cur.execute(f"INSERT INTO {table} (id, {cols}) "
                    f"SELECT id + {STREAM_OFFSET}, {cols} FROM {table}")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    (ctx,) = load_contexts(settings)
    bronze = DeltaTable(ctx.bronze_uri).to_pyarrow_table().to_pylist()
    snap = {r["after"]["id"]: r["after"] for r in bronze if r["op"] == "r"}
    streamed = {r["after"]["id"] - STREAM_OFFSET: r["after"] for r in bronze if r["op"] == "c"}
    assert sorted(snap) == sorted(streamed), (sorted(snap), sorted(streamed))
    return Captured(settings, ctx, snap, streamed)
