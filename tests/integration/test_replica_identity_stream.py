"""REPLICA IDENTITY through the stream (STR-41..45, STR-75).

* USING INDEX on a unique index that is not the primary key: pgoutput's old images carry the
  index columns only, so the index is the table's key; deletes, updates of the index columns
  and of the primary key all reach silver (STR-44, EVT key rule of seed 002).
* NOTHING, and DEFAULT without a primary key: the project never adds such a table to a
  publication it manages, so the source's own UPDATE/DELETE never start failing (STR-45);
  the error names the table and the fix.
"""

from __future__ import annotations

import psycopg2
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _settings(pg_dsn, lakehouse, include, **kw) -> CaptureSettings:
    return CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=include,
                           slot="ri", publication="ri", **kw)


def _source_writes_work(conn, table: str) -> None:
    """The source's own UPDATE and DELETE on ``table`` succeed."""
    with conn.cursor() as cur:
        cur.execute(f"UPDATE {table} SET v = v || '!'")
        cur.execute(f"DELETE FROM {table} WHERE false")


def test_using_index_not_pk_streams_deletes_and_key_changes(pg_dsn, pg_conn, spark,
                                                             lakehouse) -> None:
    """STR-41/44: USING INDEX (code) with a separate primary key (id); deletes carry the
    index columns in ``before``; an update of the index columns is a key change (delete +
    create), an update of the primary key alone is an update; silver equals the source."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE ux (id int PRIMARY KEY, code text NOT NULL, v text)")
        cur.execute("CREATE UNIQUE INDEX ux_code ON ux (code)")
        cur.execute("ALTER TABLE ux REPLICA IDENTITY USING INDEX ux_code")
        cur.execute("INSERT INTO ux SELECT g, 'c' || g, 'v' || g FROM generate_series(1, 6) g")
    settings = _settings(pg_dsn, lakehouse, ("public\\.ux",))
    run = run_bronze(settings, spark, force_snapshot_step=True)
    assert run.contexts[0].relation.key_names == ("code",)
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO ux VALUES (7, 'c7', 'v7')")
        cur.execute("UPDATE ux SET v = 'plain' WHERE id = 1")          # no old image
        cur.execute("UPDATE ux SET code = 'c2x' WHERE id = 2")         # index key change
        cur.execute("UPDATE ux SET id = 30 WHERE id = 3")              # PK change only
        cur.execute("UPDATE ux SET id = 40, code = 'c4x' WHERE id = 4")  # both
        cur.execute("DELETE FROM ux WHERE id = 5")
        cur.execute("DELETE FROM ux WHERE id = 7")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)

    bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "ux")).to_pyarrow_table()
    stream = bronze.filter(pc.not_equal(bronze["op"], "r")).sort_by(
        [("__commit_lsn", "ascending"), ("__ordinal", "ascending")]).to_pylist()
    # ``before`` is pgoutput's key-only image: the index column; v is absent (null) and
    # the NOT NULL id holds its type's zero, as for any required field without a value.
    got = [(e["op"], e["key"], e["before"] and (e["before"]["code"], e["before"]["v"]))
           for e in stream]
    assert got == [
        ("c", {"code": "c7"}, None),
        ("u", {"code": "c1"}, None),
        ("d", {"code": "c2"}, ("c2", None)),
        ("c", {"code": "c2x"}, None),
        ("u", {"code": "c3"}, None),
        ("d", {"code": "c4"}, ("c4", None)),
        ("c", {"code": "c4x"}, None),
        ("d", {"code": "c5"}, ("c5", None)),
        ("d", {"code": "c7"}, ("c7", None)),
    ]
    assert [e["after"]["id"] for e in stream if e["op"] == "u"] == [1, 30]
    assert all(e["key"]["code"] is not None for e in stream)
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "ux"),
                                "public", "ux", ["code"])


@pytest.mark.parametrize("ddl", [
    "CREATE TABLE bad (id int PRIMARY KEY, v text); "
    "ALTER TABLE bad REPLICA IDENTITY NOTHING",
    "CREATE TABLE bad (id int NOT NULL, v text)",  # no PK, DEFAULT; keyed by message.key.columns
])
def test_table_without_replica_identity_is_refused_and_source_keeps_working(
        pg_dsn, pg_conn, spark, lakehouse, ddl) -> None:
    """STR-45, STR-43/75: a filtered publication is never given a table without a replica
    identity; the error names the table and the fixes, the publication is not created or
    altered, and the source's UPDATE/DELETE on the table keep working. After the fix the
    same capture runs."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE good (id int PRIMARY KEY, v text)")
        cur.execute(ddl)
        cur.execute("INSERT INTO bad VALUES (1, 'a')")
        cur.execute("INSERT INTO good VALUES (1, 'a')")
    settings = _settings(pg_dsn, lakehouse, ("public\\.good", "public\\.bad"),
                         column_options=(("message.key.columns", "public.bad:id"),))
    with pytest.raises(ConfigurationError) as err:
        run_bronze(settings, spark, force_snapshot_step=True)
    text = str(err.value)
    assert "public.bad" in text and "REPLICA IDENTITY FULL" in text
    assert "public.good" not in text
    with pg_conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_publication WHERE pubname = 'ri'")
        assert cur.fetchone()[0] == 0
    _source_writes_work(pg_conn, "bad")

    # Captured first without it, then added: the existing publication is not altered either.
    only_good = _settings(pg_dsn, lakehouse, ("public\\.good",))
    run_bronze(only_good, spark, force_snapshot_step=True)
    with pytest.raises(ConfigurationError, match=r"public\.bad"):
        run_bronze(settings, spark, force_snapshot_step=False)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = 'ri'")
        assert [r[0] for r in cur.fetchall()] == ["good"]
    _source_writes_work(pg_conn, "bad")

    with pg_conn.cursor() as cur:
        cur.execute("ALTER TABLE bad REPLICA IDENTITY FULL")
    run_bronze(settings, spark, force_snapshot_step=False)
    _source_writes_work(pg_conn, "bad")
    with pg_conn.cursor() as cur:
        cur.execute("DELETE FROM bad")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "bad"),
                                "public", "bad", ["id"])


def test_all_tables_refused_while_a_table_lacks_replica_identity(pg_dsn, pg_conn, spark,
                                                                 lakehouse) -> None:
    """STR-45, STR-29/30: FOR ALL TABLES would include an uncaptured keyless table and break
    its writers; the project refuses to create it and says which table and what to do."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE good (id int PRIMARY KEY, v text)")
        cur.execute("CREATE TABLE log_nopk (v text)")
        cur.execute("INSERT INTO log_nopk VALUES ('x')")
    settings = _settings(pg_dsn, lakehouse, ("public\\.good",),
                         publication_autocreate="all_tables")
    with pytest.raises(ConfigurationError, match=r"FOR ALL TABLES.*public\.log_nopk"):
        run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_publication")
        assert cur.fetchone()[0] == 0
        cur.execute("UPDATE log_nopk SET v = 'y'")
        cur.execute("DELETE FROM log_nopk")
    # What the refusal prevents, shown on the server itself.
    with pg_conn.cursor() as cur:
        cur.execute("CREATE PUBLICATION demo_all FOR ALL TABLES")
        cur.execute("INSERT INTO log_nopk VALUES ('z')")
        with pytest.raises(psycopg2.errors.ObjectNotInPrerequisiteState,
                           match="does not have a replica identity"):
            cur.execute("UPDATE log_nopk SET v = 'w'")
        cur.execute("DROP PUBLICATION demo_all")
