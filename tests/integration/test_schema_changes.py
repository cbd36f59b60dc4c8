"""Schema changes in the middle of a stream (issue 4 item 3, issue 6 item 3; STR- schema
items): columns added, dropped and renamed between and inside windows lose no event, old
bronze rows keep their values, silver follows the source; a type change is refused clearly."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.evolution import SchemaChangeError
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_add_drop_rename_columns_mid_stream(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE s (id int PRIMARY KEY, a text, b int)")
        cur.execute("INSERT INTO s SELECT g, 'a' || g, g FROM generate_series(1, 20) g")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.s",),
                               slot="evo", publication="evo")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        # all in one window: old shape, add column, new shape, drop, rename
        cur.execute("UPDATE s SET b = b + 100 WHERE id <= 5")
        cur.execute("ALTER TABLE s ADD COLUMN c numeric(6,2)")
        cur.execute("UPDATE s SET c = id * 1.5 WHERE id <= 10")
        cur.execute("INSERT INTO s VALUES (21, 'new', 21, 2.25)")
        cur.execute("ALTER TABLE s DROP COLUMN b")
        cur.execute("UPDATE s SET a = 'after drop' WHERE id = 1")
        cur.execute("ALTER TABLE s RENAME COLUMN a TO title")
        cur.execute("UPDATE s SET title = 'renamed' WHERE id = 2")
        cur.execute("DELETE FROM s WHERE id = 3")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "s")).to_pyarrow_table()
    ops = pc.value_counts(bronze["op"]).to_pylist()
    assert {o["values"]: o["counts"] for o in ops} == {"r": 20, "u": 5 + 10 + 1 + 1, "c": 1,
                                                       "d": 1}
    after_fields = {f.name for f in bronze.schema.field("after").type}
    assert {"id", "a", "b", "c", "title"} <= after_fields
    first = bronze.filter(pc.and_(pc.equal(bronze["op"], "u"),
                                  pc.equal(bronze["__commit_lsn"],
                                           pc.min(bronze["__commit_lsn"])))).to_pylist()
    assert all(r["after"]["b"] > 100 and r["after"]["c"] is None for r in first)
    snap = bronze.filter(pc.equal(bronze["op"], "r")).to_pylist()
    assert all(r["after"]["b"] == r["after"]["id"] for r in snap)  # history kept its values
    # A rename reaches silver as a new column (documented limitation): rows changed after the
    # rename carry it; the old column keeps the values it had.
    silver = {r["id"]: r for r in DeltaTable(
        table_uri(str(lakehouse), "silver", "public", "s")).to_pyarrow_table().to_pylist()}
    assert silver[2]["title"] == "renamed"
    assert silver[11]["a"] == "a11" and silver[11]["title"] is None
    assert silver[3]["__deleted"] and silver[21]["c"] is not None
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE s SET title = title")  # touch every row: silver converges
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "s"),
                                "public", "s", ["id"])


def test_type_change_is_refused_with_the_fix(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE s (id int PRIMARY KEY, n int)")
        cur.execute("INSERT INTO s VALUES (1, 1)")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.s",),
                               slot="evo2", publication="evo2")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("ALTER TABLE s ALTER COLUMN n TYPE bigint")
        cur.execute("UPDATE s SET n = 5000000000")
    with pytest.raises(SchemaChangeError, match=r"after\.n.*Re-snapshot"):
        run_bronze(settings, spark, force_snapshot_step=False)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT confirmed_flush_lsn < pg_current_wal_lsn() FROM pg_replication_slots "
                    "WHERE slot_name = 'evo2'")
        assert cur.fetchone()[0]  # nothing was skipped: the slot did not move past it
