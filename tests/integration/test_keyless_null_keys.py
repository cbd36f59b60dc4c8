"""NULLs in ``message.key.columns`` keys (a keyless table keyed by nullable columns).

A NULL key value is one value, as under a unique index ``NULLS NOT DISTINCT``: silver keeps
such key columns nullable, the MERGE matches them with ``IS NOT DISTINCT FROM`` and both
silver preparers (Arrow and Spark) fold a NULL-keyed row's events into one row. Captured by
snapshot and stream (inserts, updates of NULL-keyed rows, key changes into and out of NULL,
deletes, a delete and re-insert in one batch, a TRUNCATE): silver equals the source, and the
silver asset check compares NULL keys exactly (pending ones left out, tampering named).
Tables with NOT NULL keys keep NOT NULL key columns in silver.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.silver import live_rows
from pgcdc_dagster.ops.consistency import compare_with_source
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = """
CREATE TABLE one (k text, n int);
CREATE UNIQUE INDEX one_key ON one (k) NULLS NOT DISTINCT;
ALTER TABLE one REPLICA IDENTITY FULL;
CREATE TABLE two (a int, t int NOT NULL, b text, n int);
CREATE UNIQUE INDEX two_key ON two (a, t, b) NULLS NOT DISTINCT;
ALTER TABLE two REPLICA IDENTITY FULL;
CREATE TABLE pk (id int PRIMARY KEY, v text);
INSERT INTO one VALUES ('x', 1), (NULL, 2);
INSERT INTO two VALUES (1, 0, 'x', 1), (NULL, 0, 'x', 2), (1, 0, NULL, 3), (NULL, 0, NULL, 4),
                       (2, 0, 'y', 5), (NULL, 1, NULL, 6), (3, 1, NULL, 7);
INSERT INTO pk VALUES (1, 'a');
"""
KEYS = {"one": ["k"], "two": ["a", "t", "b"], "pk": ["id"]}


@pytest.fixture(params=["arrow", "spark"])
def threshold(request) -> int:
    """Silver batches prepared in Arrow on the driver, or by Spark: same results."""
    return 10**9 if request.param == "arrow" else 0


def _settings(pg_dsn, lakehouse, threshold: int) -> CaptureSettings:
    return CaptureSettings(
        dsn=pg_dsn, lakehouse=str(lakehouse), include=(r"public\.(one|two|pk)",),
        slot="nullkeys", publication="nullkeys", silver_spark_threshold_rows=threshold,
        column_options=(("message.key.columns", "public.one:k;public.two:a,t,b"),))


def _equal(pg_conn, lakehouse) -> dict[str, int]:
    """Silver equals the source, table by table; one live row per key (no duplicates)."""
    out = {}
    for table, key in KEYS.items():
        uri = table_uri(str(lakehouse), "silver", "public", table)
        out[table] = assert_silver_equals_source(pg_conn, uri, "public", table, key)
        assert live_rows(uri).num_rows == out[table], table
    return out


def _check(settings: CaptureSettings, table: str):  # type: ignore[no-untyped-def]
    ctx = next(c for c in load_contexts(settings) if c.relation.name == table)
    return compare_with_source(settings.dsn, ctx, settings.slot, settings.publication)


def test_null_keys_through_snapshot_and_stream(pg_dsn, pg_conn, spark, lakehouse,
                                               threshold) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    settings = _settings(pg_dsn, lakehouse, threshold)
    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)
    assert _equal(pg_conn, lakehouse) == {"one": 2, "two": 7, "pk": 1}
    nullable = {t: {f.name: f.nullable for f in pa.schema(DeltaTable(table_uri(
        str(lakehouse), "silver", "public", t)).schema().to_arrow())} for t in KEYS}
    assert nullable["one"]["k"] and nullable["two"]["a"] and nullable["two"]["b"]
    assert not nullable["two"]["t"] and not nullable["pk"]["id"]  # NOT NULL stays NOT NULL

    with pg_conn.cursor() as cur:
        cur.execute("UPDATE one SET n = n + 10 WHERE k IS NULL")
        cur.execute("INSERT INTO one VALUES ('y', 3)")
        cur.execute("UPDATE two SET n = n + 100 WHERE a IS NULL AND b IS NULL")  # (N,0,N),(N,1,N)
        cur.execute("UPDATE two SET n = n + 100 WHERE a IS NULL AND b = 'x'")
        cur.execute("UPDATE two SET a = NULL WHERE a = 2")  # key change into NULL: (N,0,y)
        cur.execute("UPDATE two SET b = 'z' WHERE a = 3")  # key change out of NULL: (3,1,z)
        cur.execute("DELETE FROM two WHERE a = 1 AND b IS NULL")
        cur.execute("INSERT INTO two VALUES (1, 0, NULL, 30)")  # deleted, re-inserted
        cur.execute("UPDATE two SET n = 31 WHERE a = 1 AND b IS NULL")
        cur.execute("INSERT INTO two VALUES (NULL, 2, NULL, 8), (4, 2, NULL, 9)")
        cur.execute("DELETE FROM two WHERE a IS NULL AND t = 2 AND b IS NULL")
        cur.execute("INSERT INTO pk VALUES (2, 'b')")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    assert _equal(pg_conn, lakehouse) == {"one": 3, "two": 8, "pk": 2}
    two = DeltaTable(table_uri(str(lakehouse), "silver", "public", "two")).to_pyarrow_table()
    assert sorted(((r["a"], r["t"], r["b"]) for r in two.to_pylist() if r["__deleted"]),
                  key=repr) == [(2, 0, "y"), (3, 1, None), (None, 2, None)]
    for table, rows in (("one", 3), ("two", 8)):
        report = _check(settings, table)
        assert report.ok, report.describe()
        assert report.silver.rows == rows

    # A pending change of a NULL-keyed row is left out; tampering with one is named.
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE two SET n = -1 WHERE a IS NULL AND t = 0 AND b IS NULL")
    report = _check(settings, "two")
    assert report.ok and report.excluded_keys == 1, report.describe()
    assert report.source.rows == report.silver.rows == 7
    DeltaTable(table_uri(str(lakehouse), "silver", "public", "one")).update(
        predicate="k IS NULL", updates={"n": "0"})
    report = _check(settings, "one")
    assert not report.ok and report.different == ["(None,)"], report.describe()
    run_bronze(settings, spark, force_snapshot_step=False)
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE one SET n = 5 WHERE k IS NULL")
        cur.execute("TRUNCATE two")
        cur.execute("INSERT INTO two VALUES (NULL, 0, NULL, 40), (NULL, 0, 'x', 41), "
                    "(5, 0, NULL, 42)")
        cur.execute("UPDATE two SET n = 43 WHERE a IS NULL AND b = 'x'")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    assert _equal(pg_conn, lakehouse) == {"one": 3, "two": 3, "pk": 2}
    assert all(_check(settings, t).ok for t in KEYS)
