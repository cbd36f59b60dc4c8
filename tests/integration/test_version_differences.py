"""What differs in bronze between PostgreSQL versions: stored generated columns.

Before 18 pgoutput never sends generated columns. PostgreSQL 18's publication option
``publish_generated_columns = stored`` (default ``none``) makes it send them: the stream events
then carry the column in ``after``, while the snapshot, which reads the captured columns only
(generated ones excluded, as discovery does on every version), leaves it null in its ``r``
events, and silver keeps the captured columns only. docs/types.md documents it.
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.silver import live_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_stored_generated_columns_in_bronze_by_version(pg_dsn, pg_conn, spark,
                                                       lakehouse) -> None:
    publishes = pg_conn.server_version >= 180000
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE g (id int PRIMARY KEY, a int, "
                    "twice int GENERATED ALWAYS AS (a * 2) STORED)")
        cur.execute("INSERT INTO g (id, a) VALUES (1, 10)")
        cur.execute("CREATE PUBLICATION gp FOR TABLE g"
                    + (" WITH (publish_generated_columns = stored)" if publishes else ""))
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.g",),
                               slot="gs", publication="gp", publication_autocreate="disabled")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO g (id, a) VALUES (2, 20)")
        cur.execute("UPDATE g SET a = 11 WHERE id = 1")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)

    events = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "g")).to_pyarrow_table(
        columns=["op", "after"]).to_pylist()
    by_op = {e["op"]: e["after"] for e in events}
    assert sorted(by_op) == ["c", "r", "u"]
    if publishes:
        assert by_op["c"] == {"id": 2, "a": 20, "twice": 40}
        assert by_op["u"] == {"id": 1, "a": 11, "twice": 22}
        assert by_op["r"] == {"id": 1, "a": 10, "twice": None}
    else:
        assert by_op["c"] == {"id": 2, "a": 20} and by_op["u"] == {"id": 1, "a": 11}
        assert by_op["r"] == {"id": 1, "a": 10}
    silver = live_rows(table_uri(str(lakehouse), "silver", "public", "g")).to_pylist()
    assert sorted((r["id"], r["a"], "twice" in r) for r in silver) == [
        (1, 11, False), (2, 20, False)]
