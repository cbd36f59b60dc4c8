"""Many small tables snapshot together, and exactly.

40 small tables and 2 big ones (read in several chunks) are snapshotted in one run: the small
tables' chunks share Spark tasks (Spark's own task count is far below the chunk count), the
progress table is appended per batch of results rather than per chunk, every table's bronze and
silver are two Delta commits (each table created by the commit holding its rows), and silver
equals the source; changes made afterwards stream into
every table's silver from its snapshot offset.

What the checks and reports would read back of each table the snapshot created (versions, app
transactions, its capture commit, schema, files, stats) is known from the commit: built from
it, the facts, the silver metadata and the light checks' results equal those read from the
Delta logs, for every table (the empty one and the multi-chunk ones included).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcdc_dagster.assets.capture import _silver_metadata, committed_facts
from pgcdc_dagster.assets.checks import table_check_results
from pgcdc_dagster.capture.runner import BronzeRun, run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot_commit import TableSnapshotReport
from pgcdc_dagster.capture.snapshot_state import SnapshotLog, progress_uri
from pgcdc_dagster.lake.delta import open_table
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.delta_stats import TableStats, table_stats
from pgcdc_dagster.ops.lsn_windows import RunRange
from pgcdc_dagster.ops.table_facts import read_facts
from pgcdc_dagster.spark.snapshot_tasks import GROUP_MAX_CHUNKS
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SMALL = 40
BIG = ("big_a", "big_b")


def _create(pg_conn) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE SCHEMA many")
        for i in range(SMALL):
            if i % 5 == 0:  # a composite key among them
                cur.execute(f"CREATE TABLE many.s{i} (a text, b int, v numeric(8,2), "
                            "PRIMARY KEY (a, b))")
                cur.execute(f"INSERT INTO many.s{i} SELECT 'k' || (g %% 7), g, g * 0.25 "
                            "FROM generate_series(1, %s) g", (20 + i,))
            else:
                cur.execute(f"CREATE TABLE many.s{i} (id int PRIMARY KEY, name text, "
                            "at timestamptz)")
                cur.execute(f"INSERT INTO many.s{i} SELECT g, 'row ' || g, "
                            "'2024-01-01'::timestamptz + g * interval '1 hour' "
                            "FROM generate_series(1, %s) g", (i * 3,))  # s0.. one empty
        for name in BIG:
            cur.execute(f"CREATE TABLE many.{name} (id bigint PRIMARY KEY, v text)")
            cur.execute(f"INSERT INTO many.{name} SELECT g, repeat('v', 60) "
                        "FROM generate_series(1, 12000) g")
        cur.execute("ANALYZE")


def _keys(table: str) -> list[str]:
    return ["a", "b"] if table.startswith("s") and int(table[1:]) % 5 == 0 else ["id"]


def _converged(pg_conn, lakehouse: Path, tables: list[str]) -> None:
    for table in tables:
        assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "many", table),
                                    "many", table, _keys(table))


def _two_commits_per_table(settings: CaptureSettings, lakehouse: Path,
                           reports: list[TableSnapshotReport], snapshot_id: int) -> None:
    """Each table's snapshot is exactly two Delta commits, read from the logs: bronze and
    silver are each created by the commit holding the rows (version 0, no empty creation
    commit), bronze with its offset and the snapshot's app transaction, silver with the
    bronze version it reflects."""
    prefix = settings.app_prefix
    for report in reports:
        schema, table = report.table.split(".")
        assert (report.bronze_version, report.silver_version) == (0, 0), report
        bronze = open_table(table_uri(str(lakehouse), "bronze", schema, table))
        silver = open_table(table_uri(str(lakehouse), "silver", schema, table))
        assert bronze is not None and silver is not None
        for layer in (bronze, silver):
            history = layer.history()
            assert layer.version() == 0 and len(history) == 1, history
            assert history[0]["pgcdc.snapshot_id"] == str(snapshot_id)
            assert history[0]["pgcdc.rows"] == str(report.rows)
            assert layer.to_pyarrow_table().num_rows == report.rows
        assert bronze.transaction_version(f"{prefix}:bronze:{report.table}") == report.lsn
        assert bronze.transaction_version(f"{prefix}:snapshot:{report.table}") == snapshot_id
        assert silver.transaction_version(f"{prefix}:silver:{report.table}") == 0


def _known_equals_read_back(run: BronzeRun, checked: list[str],
                            history_limit: int = 200) -> None:
    """Facts, silver metadata and light-check results built from what the commits wrote
    equal those read back from the logs, table by table, as a batch of tables is committed
    (the lean job reports them then; same run, both ways)."""
    known = committed_facts(run)
    assert run.snapshot is not None and set(known) == {t.table for t in run.snapshot.tables}
    current = run.current_silver()
    lsn = run.snapshot.consistent_point
    runs = [RunRange("this run", lsn, None, None)]
    for ctx in run.changed():
        report = run.snapshot.table(ctx.name)
        assert report is not None
        facts = known[ctx.name]
        assert facts.bronze is not None and facts.silver is not None, ctx.name
        built, read = read_facts(ctx, history_limit, facts), read_facts(ctx, history_limit)
        assert built == read, ctx.name
        assert built.silver_schema is not None and read.silver_schema is not None
        assert built.silver_schema.equals(read.silver_schema, check_metadata=True)
        assert built.commits and built.silver_files is not None
        assert sorted(built.silver_files) == sorted(read.silver_files or ())
        for known_stats, uri in ((report.bronze_stats, ctx.bronze_uri),
                                 (report.silver_stats, ctx.silver_uri)):
            assert known_stats == table_stats(uri), uri
        silver = current[ctx.name]
        both = [_silver_metadata(silver, ctx, TableStats(None), None, None, snapshot=s,
                                 commits=c)
                for s, c in ((report.silver_stats, facts.bronze.commits), (None, None))]
        assert both[0] == both[1], ctx.name
        results = [[(r.check_name, r.passed, r.severity, r.description, r.metadata)
                    for r in table_check_results(ctx, f, runs, lsn)] for f in (built, read)]
        assert results[0] == results[1] and all(r[1] for r in results[0]), results
        checked.append(ctx.name)


def test_many_small_tables_share_tasks_and_converge(pg_dsn, pg_conn, spark, lakehouse) -> None:
    _create(pg_conn)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("many\\..*",),
                               slot="many", publication="many",
                               snapshot_chunk_bytes=256 << 10,
                               snapshot_spark_threshold_rows=0)  # read by Spark tasks
    tables = [f"s{i}" for i in range(SMALL)] + list(BIG)
    checked: list[str] = []
    run = run_bronze(settings, spark, force_snapshot_step=True,
                     on_committed=lambda part: _known_equals_read_back(part, checked))
    assert sorted(checked) == sorted(f"many.{t}" for t in tables)
    snap = run.snapshot
    assert snap is not None and snap.performed
    assert sorted(t.table for t in snap.tables) == sorted(f"many.{t}" for t in tables)
    big_chunks = sum(t.chunks for t in snap.tables if t.table.split(".")[1] in BIG)
    assert big_chunks >= 2 * len(BIG), "the big tables are read in several chunks"
    assert snap.chunks_read == big_chunks + SMALL
    # Spark's task count: a task per big chunk, and the 40 small tables in a few groups.
    groups = snap.spark_tasks - big_chunks
    assert 1 <= groups <= SMALL // 4, (snap.spark_tasks, big_chunks)
    assert groups >= -(-SMALL // GROUP_MAX_CHUNKS)
    # The progress table got the chunks and the commits in batches, not one append each.
    progress = open_table(progress_uri(str(lakehouse), "many"))
    assert progress is not None and progress.version() + 1 < snap.chunks_read
    state = SnapshotLog(progress_uri(str(lakehouse), "many")).load()
    assert state is not None and state.finished
    assert state.committed == {("many", t) for t in tables}
    assert sum(len(c) for c in state.chunks.values()) == snap.chunks_read
    _two_commits_per_table(settings, lakehouse, snap.tables, state.snapshot_id)
    run_silver(settings, spark)
    _converged(pg_conn, lakehouse, tables)
    # Changes after the snapshot stream from each table's offset, small and big alike.
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE many.s1 SET name = 'changed' WHERE id = 1")
        cur.execute("DELETE FROM many.s5 WHERE b = 6")
        cur.execute("INSERT INTO many.s3 VALUES (1000, 'new', now())")
        cur.execute("UPDATE many.big_b SET v = 'w' WHERE id % 1000 = 0")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    _converged(pg_conn, lakehouse, tables)
