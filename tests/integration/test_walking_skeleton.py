"""Walking skeleton: snapshot + micro-batches land exact bronze and silver.

Covers SNAP-03/05 (consistent snapshot then stream from its point), STR-18 (advance only
after the commit), EVT-12 (op codes c/u/d/r), FT-10 (no duplicates on re-run).
"""

from __future__ import annotations

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source
from tests.support.workload import SCHEMA, Workload

pytestmark = [pytest.mark.integration, pytest.mark.spark]

def _bronze_ops(lakehouse, table: str) -> dict[str, int]:
    data = DeltaTable(table_uri(str(lakehouse), "bronze", "public", table)).to_pyarrow_table(
        columns=["op"])
    counts = pc.value_counts(data["op"]).to_pylist()
    return {c["values"]: c["counts"] for c in counts}


def test_snapshot_then_microbatches_converge(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                               slot="skeleton", publication="skeleton",
                               window_max_bytes=2 << 20)
    run = run_bronze(settings, spark, force_snapshot_step=True)
    assert run.snapshot is not None and run.snapshot.performed
    assert {t.table: t.rows for t in run.snapshot.tables} == {
        "public.Mixed Case": 300, "public.accounts": 500, "public.events": 800}
    run_silver(settings, spark)

    workload = Workload(pg_conn, seed=42)
    changes = 0
    for _ in range(4):
        changes = workload.run(700)
        run = run_bronze(settings, spark, force_snapshot_step=False)
        assert run.stream is not None
        run_silver(settings, spark)
    assert changes >= 10_000

    with pg_conn.cursor() as cur:
        cur.execute("CHECKPOINT")
    for table, key in (("accounts", ["id"]), ("events", ["id"]), ("Mixed Case", ["Key", "part"])):
        uri = table_uri(str(lakehouse), "silver", "public", table)
        assert_silver_equals_source(pg_conn, uri, "public", table, key)
        ops = _bronze_ops(lakehouse, table)
        expected = {op: n for op, n in workload.expected[table].items() if n}
        snapshot_rows = {"accounts": 500, "events": 800, "Mixed Case": 300}[table]
        assert ops == {"r": snapshot_rows, **expected}, table

    versions = {t: DeltaTable(table_uri(str(lakehouse), "bronze", "public", t)).version()
                for t in ("accounts", "events", "Mixed Case")}
    run = run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    assert all(not w.events_by_table for w in run.stream.windows)
    for t, v in versions.items():
        assert DeltaTable(table_uri(str(lakehouse), "bronze", "public", t)).version() == v
