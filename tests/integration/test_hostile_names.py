"""Source names are data, end to end.

One source database with hostile names, captured through the engine (snapshot, then
micro-batches of inserts, updates and deletes touching the hostile columns); the hostile
columns in both silver engines (Arrow on the driver, and Spark, selected by
``silver_spark_threshold_rows``):

* columns named with quotes, a backtick, a backslash, spaces, operators, SQL text, dots, a
  key column ``"s"."k"``, non-ASCII and 63 bytes, some of them TOASTed: every table's silver
  equals its source, value by value, including updates of those columns and unchanged-TOAST
  updates (before the fix: a failed MERGE, or updates silently dropped);
* schemas and tables named ``..``, ``.``, ``a/b`` next to ``a%2Fb``, ``_pgcdc`` with
  ``schema_history`` / ``messages`` / ``transactions``, names differing only in case or in
  ``-`` vs ``_``: nothing is written outside the lakehouse root, every table has a directory
  of its own that decodes back to its name, and the project's own tables hold only their own
  rows;
* a table whose columns differ only in letter case, and one with a column named like a silver
  metadata column, cannot be stored: each is left out (``BronzeRun.skipped``, which the
  bronze asset logs and puts in its metadata) with the columns and the fix named, while
  every other table converges.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from deltalake import DeltaTable
from psycopg2 import sql

from pgcdc_dagster.capture.bronze_write import internal_events_key
from pgcdc_dagster.capture.runner import BronzeRun, run_bronze, run_silver, select_contexts
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot_state import progress_uri
from pgcdc_dagster.capture.stream import capture_set_uri
from pgcdc_dagster.cdc.metadata_events import TRANSACTIONS_SCHEMA
from pgcdc_dagster.export import main as export_main
from pgcdc_dagster.lake.paths import internal_uri, table_names, table_uri
from pgcdc_dagster.lake.schema_history import HISTORY_SCHEMA, history_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

KEY = '"s"."k"'
LONG = "l" * 60 + "ong"  # 63 bytes, PostgreSQL's longest name
HOSTILE = ["it's", 'say "hi"', "back`tick", "back\\slash", " spaced name ", "a + b",
           "x OR 1=1", "x') OR ('1", "t.id", "Ünïcødé 名前", LONG]
TOASTED = HOSTILE[:4]
"""Columns holding values stored out of line: an update of another column leaves them as
unchanged-TOAST placeholders, kept by the MERGE's per-column test of the column's name."""
BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 150))"
# (schema, table, key column): plain two-column tables whose names are the hostile part.
NAMED = [("..", ".."), (".", "."), ("a/b", "a/b"), ("a%2Fb", "a/b"), ("a/b", "a%2Fb"),
         ("_pgcdc", "schema_history"), ("_pgcdc", "messages"), ("_pgcdc", "transactions"),
         ("_PGCDC", "messages"), ("public", "Orders"), ("public", "orders"),
         ("public", "a-b"), ("public", "a_b"), ("public", ".hidden"), ("we ird", "ta'ble")]
REFUSED = {("public", "cased"): ["'Name'", "'name'"], ("public", "meta"): ["'__op'"]}


def _ident(*names: str) -> sql.Identifier:
    return sql.Identifier(*names)


def _create(cur) -> None:
    for schema in sorted({s for s, _ in NAMED} - {"public"}):
        cur.execute(sql.SQL("CREATE SCHEMA {}").format(_ident(schema)))
    for schema, table in NAMED:
        cur.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(
            _ident(schema, table)))
    cols = sql.SQL(", ").join(sql.SQL("{} text").format(_ident(c)) for c in HOSTILE)
    cur.execute(sql.SQL("CREATE TABLE public.hostile ({} int PRIMARY KEY, {}, n int)").format(
        _ident(KEY), cols))
    cur.execute('CREATE TABLE public.cased (id int PRIMARY KEY, "Name" text, name text)')
    cur.execute('CREATE TABLE public.meta (id int PRIMARY KEY, __op text, v text)')


def _run(cur, query: str, *parts: sql.Composable) -> None:
    """Execute composed SQL without parameters: psycopg2 would read a ``%`` inside a quoted
    name (``a%2Fb``) as a placeholder."""
    cur.execute(sql.SQL(query).format(*parts))


def _write(cur, phase: int) -> None:
    """Inserts, updates and deletes of every table; the hostile columns in every kind."""
    lit = sql.Literal
    for schema, table in NAMED:
        t = _ident(schema, table)
        _run(cur, "INSERT INTO {} SELECT g, {} || g FROM generate_series({}, {}) g",
             t, lit(f"p{phase}-"), lit(phase * 10), lit(phase * 10 + 4))
        _run(cur, "UPDATE {} SET v = v || '+' WHERE id % 3 = {}", t, lit(phase % 3))
        _run(cur, "DELETE FROM {} WHERE id = {}", t, lit(phase * 10 - 9))
    for other in ("cased", "meta"):
        _run(cur, "INSERT INTO {} VALUES ({}, 'a', 'b')", _ident("public", other), lit(phase))
    h, key = _ident("public", "hostile"), _ident(KEY)
    values = sql.SQL(", ").join(
        sql.SQL(BIG) if c in TOASTED else lit(f"p{phase}:{c}") for c in HOSTILE)
    _run(cur, "INSERT INTO {} SELECT g, {}, g FROM generate_series({}, {}) g",
         h, values, lit(phase * 10), lit(phase * 10 + 5))
    if phase == 0:
        return
    # Every hostile column updated on its own (the TOASTed others stay unchanged), then all
    # together, a key change of the quoted key column, a delete.
    for i, col in enumerate(HOSTILE):
        _run(cur, "UPDATE {} SET {} = {}, n = n + 1 WHERE {} = {}", h, _ident(col),
             lit(f"u{phase}:{col}"), key, lit(i % 5 + (phase - 1) * 10))
    _run(cur, "UPDATE {} SET n = n + 100 WHERE {} % 2 = 0", h, key)
    _run(cur, "UPDATE {} SET {} = {} + 1000 WHERE {} = {}", h, key, key, key,
         lit(phase * 10 + 5))
    _run(cur, "DELETE FROM {} WHERE {} = {}", h, key, lit(phase * 10 + 4))
    _run(cur, "SELECT pg_logical_emit_message(true, 'app', {})", lit(f"phase {phase}"))


def _outside(root: Path, lake: Path) -> set[str]:
    """Every file and directory under ``root`` except the lakehouse's."""
    every = {str(Path(d, f)) for d, _, fs in os.walk(root) for f in [*fs, "."]}
    return {p for p in every if p != str(lake) and not p.startswith(f"{lake}{os.sep}")}


def _capture(settings: CaptureSettings, pg_conn, spark) -> list[BronzeRun]:
    """The snapshot and two micro-batches, each after a phase of writes."""
    with pg_conn.cursor() as cur:
        _create(cur)
        _write(cur, 0)
    runs = [run_bronze(settings, spark, force_snapshot_step=True)]
    run_silver(settings, spark)
    for phase in (1, 2):
        with pg_conn.cursor() as cur:
            _write(cur, phase)
        runs.append(run_bronze(settings, spark, force_snapshot_step=False))
        run_silver(settings, spark)
    return runs


def _assert_hostile_converged(pg_conn, lake: Path) -> None:
    assert assert_silver_equals_source(
        pg_conn, table_uri(str(lake), "silver", "public", "hostile"), "public", "hostile",
        [KEY]) == 16
    with pg_conn.cursor() as cur:  # the updates of single hostile columns are in the source
        cur.execute(sql.SQL("SELECT count(*) FROM public.hostile WHERE {} = %s").format(
            _ident("a + b")), ("u2:a + b",))
        assert cur.fetchone()[0] == 1


def test_hostile_columns_in_the_spark_engine(pg_dsn, pg_conn, spark, lakehouse) -> None:
    """The Spark preparer (every batch above the threshold of 0 rows) on the hostile
    columns; the Arrow preparer runs in the test below."""
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), slot="hostile_spark",
                               publication="hostile_spark", include=("public\\.hostile",),
                               silver_spark_threshold_rows=0)
    _capture(settings, pg_conn, spark)
    _assert_hostile_converged(pg_conn, lakehouse)


def test_hostile_names_converge_inside_the_lakehouse(pg_dsn, pg_conn, spark, tmp_path) -> None:
    box = tmp_path / "box"
    lake = box / "lake"
    lake.mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("x")
    around_before = _outside(tmp_path, lake)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lake), slot="hostile",
                               publication="hostile", provide_transaction_metadata=True,
                               silver_spark_threshold_rows=10**9)
    runs = _capture(settings, pg_conn, spark)

    # Every storable table is captured and its silver equals the source.
    captured = {c.relation.qualified for c in select_contexts(settings, None)}
    assert captured == {*NAMED, ("public", "hostile")}
    for schema, table in NAMED:
        assert assert_silver_equals_source(
            pg_conn, table_uri(str(lake), "silver", schema, table), schema, table, ["id"]) > 5
    _assert_hostile_converged(pg_conn, lake)

    # The unstorable tables are left out, with the columns and the fix named.
    for run in runs:
        skipped = {(t.schema, t.table): t for t in run.skipped}
        assert set(skipped) == set(REFUSED)
        for name, cols in REFUSED.items():
            assert all(c in skipped[name].reason for c in cols), skipped[name]
            assert "rename one of these columns" in skipped[name].fix
            assert not Path(table_uri(str(lake), "bronze", *name)).exists()

    # Nothing outside the lakehouse root; every table directory decodes to its own name.
    assert _outside(tmp_path, lake) == around_before  # and nothing above tmp_path: ".." is
    assert not Path(lake.parent, "~2E~2E").exists()  # escaped within the lakehouse
    assert sorted(os.listdir(box)) == ["lake"]
    for layer in ("bronze", "silver"):
        found = set()
        for schema_dir in os.listdir(lake / layer):
            for table_dir in os.listdir(lake / layer / schema_dir):
                if layer == "bronze" and schema_dir == "_pgcdc":
                    continue
                found.add(table_names(schema_dir, table_dir))
        assert found == captured, layer

    # The project's own tables hold their own rows only.
    assert sorted(os.listdir(lake / "bronze" / "_pgcdc")) == [
        "messages", "schema_history", "transactions"]
    history = DeltaTable(history_uri(str(lake))).to_pyarrow_table()
    assert history.schema.names == HISTORY_SCHEMA.names
    assert {(r["schema"], r["table"]) for r in history.to_pylist()} == captured
    messages = DeltaTable(internal_uri(str(lake), "messages")).to_pyarrow_table().to_pylist()
    assert sorted(bytes(m["message"]["content"]) for m in messages) == [b"phase 1", b"phase 2"]
    tx = DeltaTable(internal_uri(str(lake), "transactions")).to_pyarrow_table()
    assert tx.schema.names == TRANSACTIONS_SCHEMA.names and tx.num_rows > 0
    assert set(tx["status"].to_pylist()) == {"BEGIN", "END"}
    for run in runs[1:]:  # the run's counts: the source table's and the capture's apart
        assert run.stream is not None
        counts = run.stream.events_by_table()
        assert counts[internal_events_key("messages")] == {"m": 1}
        assert set(counts["_pgcdc.messages"]) == {"c", "u", "d"}
    assert Path(capture_set_uri(str(lake), "hostile")).is_dir()
    assert Path(progress_uri(str(lake), "hostile")).is_dir()
    # QA: the export CLI reaches both: _pgcdc.messages is the capture's, the source table of
    # schema _pgcdc is "_pgcdc".messages (it had no spelling: both read the capture's).
    for name, ops in (("_pgcdc.messages", {"m"}), ('"_pgcdc".messages', {"c", "u", "d", "r"})):
        out = io.StringIO()
        assert export_main(["--lakehouse", str(lake), "--table", name, "--value-only"],
                           out) == 0, name
        events = [json.loads(line)["payload"] for line in out.getvalue().splitlines()
                  if line != "null"]
        assert {e["op"] for e in events} == ops, name


@pytest.mark.parametrize("plugin", ["wal2json", "decoderbufs"])
def test_hostile_names_through_the_other_plugins(pg_dsn, pg_conn, spark, lakehouse,
                                                 plugin: str) -> None:
    """wal2json and decoderbufs write names their own way (JSON strings with escapes;
    ``quote_identifier``): their readers' fast paths must fall back or match exactly, and
    the hostile columns (quotes, backslash, dots, TOAST) still converge."""
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), slot=f"hostile_{plugin}",
                               publication=f"hostile_{plugin}", plugin_name=plugin,
                               include=("public\\.hostile", "we ird\\.ta'ble"))
    _capture(settings, pg_conn, spark)
    _assert_hostile_converged(pg_conn, lakehouse)
    assert assert_silver_equals_source(
        pg_conn, table_uri(str(lakehouse), "silver", "we ird", "ta'ble"), "we ird", "ta'ble",
        ["id"]) > 5
