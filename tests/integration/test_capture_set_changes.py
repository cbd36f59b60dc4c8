"""Tables removed from the capture set and added back (STR-29/30, STR-11,
FT-12).

While a table is out, windows are read without it and its changes are dropped; its bronze
offset stays behind. Reusing that offset when it comes back would lose those changes, so the
table is snapshotted again (silver replaced). In ``filtered`` mode the publication follows the
capture set, as Debezium's filtered mode sets it to the filtered tables.
"""

from __future__ import annotations

import dataclasses
import shutil

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.capture.stream import run_windows
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.evolution import SchemaChangeError
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _published(conn) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = 'cs' "
                    "ORDER BY 1")
        return [r[0] for r in cur.fetchall()]


def _silver_equal(conn, lakehouse, table: str) -> None:
    assert_silver_equals_source(conn, table_uri(str(lakehouse), "silver", "public", table),
                                "public", table, ["id"])


def test_readded_table_is_snapshotted_again(pg_dsn, pg_conn, spark, lakehouse) -> None:
    """FT-12/STR-11: nothing changed while a table was out of the capture set is lost when
    it is added back: the rows inserted, updated and deleted meanwhile all reach silver; the
    publication drops the table while it is out (filtered) and gets it back."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        cur.execute("CREATE TABLE b (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO a SELECT g, 'a' FROM generate_series(1, 5) g")
        cur.execute("INSERT INTO b SELECT g, 'b' FROM generate_series(1, 5) g")
    both = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse),
                           include=("public\\.a", "public\\.b"), slot="cs", publication="cs")
    only_a = dataclasses.replace(both, include=("public\\.a",))
    run_bronze(both, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE b SET v = 'streamed' WHERE id = 1")
    run_bronze(both, spark, force_snapshot_step=False)
    assert _published(pg_conn) == ["a", "b"]

    run_bronze(only_a, spark, force_snapshot_step=False)
    assert _published(pg_conn) == ["a"]
    with pg_conn.cursor() as cur:  # while b is out
        cur.execute("INSERT INTO b VALUES (6, 'while out')")
        cur.execute("UPDATE b SET v = 'changed while out' WHERE id = 2")
        cur.execute("DELETE FROM b WHERE id = 3")
        cur.execute("INSERT INTO a VALUES (6, 'a')")
    run_bronze(only_a, spark, force_snapshot_step=False)
    b_offset = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "b")).version()

    # No stream (an incremental-snapshot run's, say) may resume b on its stale offset.
    with pytest.raises(ConfigurationError, match=r"public\.b.*out of the capture set"):
        run_windows(both, load_contexts(both), SourceIdentity("cs", "db"))

    run = run_bronze(both, spark, force_snapshot_step=False)
    assert any("re-snapshot of public.b" in n for n in run.notes), run.notes
    assert _published(pg_conn) == ["a", "b"]
    assert DeltaTable(table_uri(str(lakehouse), "bronze", "public", "b")).version() > b_offset
    with pg_conn.cursor() as cur:  # b streams again after its new snapshot
        cur.execute("UPDATE b SET v = 'after return' WHERE id = 4")
        cur.execute("DELETE FROM b WHERE id = 5")
    run_bronze(both, spark, force_snapshot_step=False)
    run_silver(both, spark)
    _silver_equal(pg_conn, lakehouse, "a")
    _silver_equal(pg_conn, lakehouse, "b")
    # Steady state: the next run snapshots nothing again.
    again = run_bronze(both, spark, force_snapshot_step=False)
    assert not any("re-snapshot" in n for n in again.notes)
    assert again.snapshot is not None and not again.snapshot.performed


def test_added_table_snapshotted_others_keep_their_offsets(pg_dsn, pg_conn, spark,
                                                           lakehouse, tmp_path) -> None:
    """STR-29/30 (filtered adds the table), SNAP: a table added to the capture set gets its
    snapshot; the tables that stayed keep streaming on their offsets (no needless snapshot)."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        cur.execute("CREATE TABLE b (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO b VALUES (1, 'b')")
    only_a = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.a",),
                             slot="cs", publication="cs")
    both = dataclasses.replace(only_a, include=("public\\.a", "public\\.b"))
    run_bronze(only_a, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO a VALUES (1, 'a')")
        cur.execute("UPDATE b SET v = 'before b is captured'")
    run_bronze(only_a, spark, force_snapshot_step=False)
    assert _published(pg_conn) == ["a"]
    run = run_bronze(both, spark, force_snapshot_step=False)
    assert run.snapshot is not None
    assert [t.table for t in run.snapshot.tables] == ["public.b"], run.snapshot.tables
    assert _published(pg_conn) == ["a", "b"]
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE a SET v = 'x'")
        cur.execute("UPDATE b SET v = 'x'")
    run = run_bronze(both, spark, force_snapshot_step=False)
    assert not any("re-snapshot" in n for n in run.notes), run.notes
    assert run.snapshot is not None and not run.snapshot.performed
    run_silver(both, spark)
    _silver_equal(pg_conn, lakehouse, "a")
    _silver_equal(pg_conn, lakehouse, "b")

    # b dropped and created again under its name (QA, STR- schema items): the old b's last
    # changes stay in bronze, the new b's rows (written before it joined the publication)
    # reach silver by a new snapshot, and nothing of the old b stays live in silver.
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO b VALUES (99, 'only in the old b')")
        cur.execute("DROP TABLE b")
        cur.execute("CREATE TABLE b (id int PRIMARY KEY, v text, extra int)")
        cur.execute("INSERT INTO b SELECT g, 'new b', g FROM generate_series(1, 3) g")
        cur.execute("UPDATE a SET v = 'y'")
    run = run_bronze(both, spark, force_snapshot_step=False)
    assert [n.split(" at ")[0] for n in run.notes if "re-snapshot" in n] == [
        "re-snapshot of public.b (dropped and created again): 3 rows"], run.notes
    run_silver(both, spark)
    _silver_equal(pg_conn, lakehouse, "a")
    _silver_equal(pg_conn, lakehouse, "b")
    bronze_b = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "b")).to_pyarrow_table()
    assert {"r": 1 + 3, "u": 1, "c": 1} == {o["values"]: o["counts"] for o in
                                   pc.value_counts(bronze_b["op"]).to_pylist()}
    again = run_bronze(both, spark, force_snapshot_step=False)  # steady state: no snapshot
    assert not any("re-snapshot" in n for n in again.notes), again.notes

    # Created again with another key type: refused, naming the fix (move bronze and silver
    # aside); after that, the run's snapshot step takes b once, and its new OID is logged.
    with pg_conn.cursor() as cur:
        cur.execute("DROP TABLE b")
        cur.execute("CREATE TABLE b (id bigint PRIMARY KEY, v text)")
        cur.execute("INSERT INTO b VALUES (5000000000, 'wide')")
    with pytest.raises(SchemaChangeError, match="key column id"):
        run_bronze(both, spark, force_snapshot_step=False)
    for layer in ("bronze", "silver"):
        shutil.move(table_uri(str(lakehouse), layer, "public", "b"), tmp_path / layer)
    run = run_bronze(both, spark, force_snapshot_step=False)
    assert run.snapshot is not None and [t.table for t in run.snapshot.tables] == ["public.b"]
    assert not any("re-snapshot" in n for n in run.notes), run.notes  # not twice
    run_silver(both, spark)
    _silver_equal(pg_conn, lakehouse, "b")
    again = run_bronze(both, spark, force_snapshot_step=False)
    assert not any("re-snapshot" in n for n in again.notes), again.notes


def test_partitioned_table_streams_through_its_root(pg_dsn, pg_conn, spark, lakehouse) -> None:
    """A partitioned table is captured as its root: the publication publishes changes via the
    root (pgoutput names the root, not the partition), a second run does not re-add it
    (``pg_publication_tables`` lists partitions otherwise: DuplicateObject), and changes in
    any partition, a row moved between partitions included, reach the root's silver."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE p (id int, r text, v text, PRIMARY KEY (id, r)) "
                    "PARTITION BY LIST (r)")
        cur.execute("CREATE TABLE p_eu PARTITION OF p FOR VALUES IN ('eu')")
        cur.execute("CREATE TABLE p_us PARTITION OF p FOR VALUES IN ('us')")
        cur.execute("INSERT INTO p SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 'v' "
                    "FROM generate_series(1, 10) g")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.p",),
                               slot="cs", publication="cs")
    run_bronze(settings, spark, force_snapshot_step=True)
    assert _published(pg_conn) == ["p"]
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE p SET v = 'streamed' WHERE id <= 4")
        cur.execute("DELETE FROM p WHERE id = 5")
        cur.execute("INSERT INTO p VALUES (11, 'eu', 'new')")
        cur.execute("UPDATE p SET r = 'eu' WHERE id = 7")  # moves to another partition
    run_bronze(settings, spark, force_snapshot_step=False)
    run_bronze(settings, spark, force_snapshot_step=False)
    assert _published(pg_conn) == ["p"]
    run_silver(settings, spark)
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "p"),
                                "public", "p", ["id", "r"])


def test_existing_publication_of_partitioned_table_publishes_via_root(pg_conn) -> None:
    """A publication made without publish_via_partition_root (by hand, or by an older
    version) is switched to it in 'filtered' mode; 'disabled' refuses it naming the fix."""
    from pgcdc_dagster.cdc.changes import Relation
    from pgcdc_dagster.postgres.slot import ensure_publication

    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE q (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        cur.execute("CREATE TABLE q_1 PARTITION OF q FOR VALUES FROM (0) TO (100)")
        cur.execute("CREATE PUBLICATION cs FOR TABLE q")
    q = Relation(0, "public", "q", "d", ())
    with pytest.raises(ConfigurationError, match=r"publish_via_partition_root = true"):
        ensure_publication(pg_conn, "cs", [q], "disabled")
    ensure_publication(pg_conn, "cs", [q])
    ensure_publication(pg_conn, "cs", [q])  # idempotent: no DuplicateObject
    with pg_conn.cursor() as cur:
        cur.execute("SELECT pubviaroot FROM pg_publication WHERE pubname = 'cs'")
        assert cur.fetchone() == (True,)
    assert _published(pg_conn) == ["q"]
    ensure_publication(pg_conn, "cs", [q], "disabled")  # now accepted


def test_partitioned_table_left_out_under_plugins_naming_partitions(pg_dsn, pg_conn,
                                                                     lakehouse) -> None:
    """wal2json and decoderbufs name a change by the partition holding the row, never by the
    captured partitioned table, so its streamed changes would be dropped silently: the table
    is left out with its reason and fix (an error when PGCDC_TABLES names it); pgoutput
    captures it."""
    from pgcdc_dagster.capture.snapshot import load_capture

    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE p (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        cur.execute("CREATE TABLE p_1 PARTITION OF p FOR VALUES FROM (0) TO (100)")
        cur.execute("CREATE TABLE plain (id int PRIMARY KEY)")
    base = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                           slot="cs", publication="cs")
    for plugin in ("wal2json", "decoderbufs"):
        captured, skipped = load_capture(dataclasses.replace(base, plugin_name=plugin))
        assert [c.relation.name for c in captured] == ["plain"]
        assert [s.table for s in skipped] == ["p"]
        assert plugin in skipped[0].reason and "pgoutput" in skipped[0].fix
    with pytest.raises(ConfigurationError, match=r"names public\.p.*pgoutput"):
        load_capture(dataclasses.replace(base, plugin_name="wal2json", include=("public\\.p",)))
    captured, skipped = load_capture(base)
    assert [c.relation.name for c in captured] == ["p", "plain"] and not skipped
