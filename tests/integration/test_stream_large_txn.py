"""A huge transaction streams with bounded memory.

One transaction of 1,000,000 inserted (narrow) rows, plus 10,000 updates and 10,000 deletes in
the same transaction, is read in a single window; with ``window_portion_changes = 50_000`` the
bronze writer receives it in portions while the COPY still streams, never more than the bound
at once, and bronze and silver are exact afterwards (one event per change, silver equal to the
source; STR-69 transaction order, design.md §3 decisions 2-4).

The portion sizes are observed by a spy around the real ``peek_window``: it wraps the real
``on_portion`` callback (the real bronze writer still receives every portion) and records
how many changes each portion carried. The Python heap is bounded as well: ``tracemalloc``
(which sees every Python object, not Arrow's buffers) measures the peak during the bronze
run, and it must stay under ``PY_HEAP_LIMIT`` (64 MiB). Measured here: 17 MiB with portions;
the same run with ``window_portion_changes = 0`` (the whole transaction decoded as Python
objects before it is converted) peaks at 267 MiB and fails this assertion.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

import pgcdc_dagster.capture.stream as stream
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.changes import Window
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROWS = 1_000_000
PORTION = 50_000
PY_HEAP_LIMIT = 64 << 20


def test_huge_transaction_goes_through_in_bounded_portions(pg_dsn, pg_conn, spark, lakehouse,
                                                           monkeypatch) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE big (id int PRIMARY KEY, grp int)")
        cur.execute("INSERT INTO big VALUES (0, 0)")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.big",),
                               slot="huge", publication="huge",
                               window_portion_changes=PORTION, window_max_changes=0)
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:  # one transaction: inserts, then updates and deletes
        cur.execute("BEGIN")
        cur.execute("INSERT INTO big SELECT g, g %% 7 FROM generate_series(1, %s) g", (ROWS,))
        cur.execute("UPDATE big SET grp = -1 WHERE id BETWEEN 1 AND 10000")
        cur.execute("DELETE FROM big WHERE id > %s", (ROWS - 10_000,))
        cur.execute("COMMIT")
    changes = ROWS + 10_000 + 10_000

    portions: list[int] = []
    real_peek = stream.peek_window

    def spy(*args: Any, on_portion: Callable[[Window], None] | None = None,
            **kwargs: Any) -> Window:
        def counting(portion: Window) -> None:
            portions.append(sum(len(s) for s in portion.segments()))
            assert on_portion is not None
            on_portion(portion)
        return real_peek(*args, on_portion=counting if on_portion else None, **kwargs)

    monkeypatch.setattr(stream, "peek_window", spy)
    tracemalloc.start()
    try:
        report = run_bronze(settings, spark, force_snapshot_step=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    run_silver(settings, spark)

    assert report.stream is not None and len(report.stream.windows) == 1
    assert max(portions) <= PORTION
    assert peak < PY_HEAP_LIMIT, f"Python heap peaked at {peak >> 20} MiB during the bronze run"
    assert sum(portions) >= changes - PORTION  # all but the last part came in portions
    assert len(portions) >= changes // PORTION - 1
    bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "big")).to_pyarrow_table()
    streamed = bronze.filter(pc.not_equal(bronze["op"], "r"))
    counts = {r["values"]: r["counts"] for r in pc.value_counts(streamed["op"]).to_pylist()}
    assert counts == {"c": ROWS, "u": 10_000, "d": 10_000}
    assert streamed.num_rows == changes
    # One event per change, in transaction order: total_order runs 1..changes without gaps.
    order = pc.struct_field(streamed["transaction"], "total_order")
    assert sorted(order.to_pylist()) == list(range(1, changes + 1))
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "big"),
                                "public", "big", ["id"])
