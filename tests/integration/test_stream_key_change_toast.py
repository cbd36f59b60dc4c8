"""Primary-key changes with an unchanged TOAST value under REPLICA IDENTITY DEFAULT.

The UPDATE arrives as a delete of the old key plus a create of the new key whose TOASTed
column holds the placeholder (pgoutput tuple kind ``u``; STR-46..52, TYPE-17, IMP-06). Silver
must store the real value: from the old key's earlier events in the same batch, from the old
key's silver row, through chains of key changes; only when nothing holds it (the old row was
never captured) is the placeholder kept, with a warning naming table, key and column.
"""

from __future__ import annotations

import logging

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.silver import live_rows
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# ~13 kB of hex, stored out of line uncompressed (STORAGE EXTERNAL): a real TOAST value.
BIG = "(SELECT string_agg(md5(%s || g::text), '') FROM generate_series(1, 400) g)"
PLACEHOLDER = "__debezium_unavailable_value"


def _create(cur, name: str) -> None:
    cur.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, n int, doc text)")
    cur.execute(f"ALTER TABLE {name} ALTER COLUMN doc SET STORAGE EXTERNAL")


def _docs(lakehouse, table: str) -> dict[int, str]:
    live = live_rows(table_uri(str(lakehouse), "silver", "public", table))
    return dict(zip(live["id"].to_pylist(), live["doc"].to_pylist(), strict=True))


def test_key_change_keeps_unchanged_toast(pg_dsn, pg_conn, spark, lakehouse, caplog) -> None:
    with pg_conn.cursor() as cur:
        _create(cur, "docs")
        _create(cur, "late")  # streamed without its existing rows (not snapshotted)
        cur.execute(f"INSERT INTO docs VALUES (1, 0, {BIG})", ("a",))
        cur.execute(f"INSERT INTO late VALUES (1, 0, {BIG})", ("z",))
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse),
                               include=("public\\.(docs|late)",), slot="kc", publication="kc",
                               snapshot_include=("public\\.docs",))
    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)

    # 1. The old key's value is only in silver.
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE docs SET id = 2 WHERE id = 1")
    run_bronze(settings, spark, force_snapshot_step=False)
    bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "docs")).to_pyarrow_table()
    moved = bronze.filter(pc.equal(bronze["op"], "c")).to_pylist()
    assert [(r["key"]["id"], r["after"]["doc"], r["__toast_unchanged"]) for r in moved] == [
        (2, PLACEHOLDER, ["doc"])]  # bronze keeps Debezium's event as it is
    run_silver(settings, spark)

    # 2. In one batch: a new row, an update leaving its TOAST value, a key change; and a
    #    chain of key changes of a row whose value is in silver.
    with pg_conn.cursor() as cur:
        cur.execute(f"INSERT INTO docs VALUES (10, 0, {BIG})", ("b",))
        cur.execute("UPDATE docs SET n = 5 WHERE id = 10")
        cur.execute("UPDATE docs SET id = 11 WHERE id = 10")
        cur.execute("UPDATE docs SET id = 3 WHERE id = 2")
        cur.execute("UPDATE docs SET n = 7 WHERE id = 3")
        cur.execute("UPDATE docs SET id = 4 WHERE id = 3")
    # 3. Nothing holds the old value: the row predates the capture of its table.
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE late SET id = 2 WHERE id = 1")
    run_bronze(settings, spark, force_snapshot_step=False)
    with caplog.at_level(logging.WARNING, logger="pgcdc_dagster"):
        run_silver(settings, spark)

    docs = _docs(lakehouse, "docs")
    assert sorted(docs) == [4, 11]
    assert PLACEHOLDER not in docs.values() and all(len(v) == 12_800 for v in docs.values())
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "docs"),
                                "public", "docs", ["id"])
    assert _docs(lakehouse, "late") == {2: PLACEHOLDER}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "unchanged TOAST" in r.getMessage()]
    assert len(warnings) == 1 and "public.late" in warnings[0] and "'id': 2" in warnings[0] \
        and "doc" in warnings[0]
