"""Names holding ``%`` or braces, and names whose dots make ``schema.table`` ambiguous, through
the documented interfaces.

One source database: schemas and tables named ``%s``, ``a%2Fb``, ``pct%(k)s``, ``{}``,
``50%%`` with columns ``v%``, ``%(k)s``, ``{0}``, ``%%`` (psycopg2 %-formats a statement's whole
text when it gets parameters); and schema ``a.b`` table ``c`` next to schema ``a`` table
``b.c``, both ``a.b.c`` when written plainly. ``dagster job execute`` runs the initial snapshot
and a micro-batch of inserts, updates and deletes; in process, an incremental snapshot of a
``%`` table in small chunks with an ``additional-conditions`` filter holding ``%``, a signal
through the signalling table naming one dotted table by its quoted form (and a refused
ambiguous one), the checks, the export CLI and the teardown. Every table converges on its
own: its own counts, progress and silver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
from deltalake import DeltaTable
from psycopg2 import sql

from pgcdc_dagster.assets.incremental import INCREMENTAL_KEY
from pgcdc_dagster.assets.keys import bronze_key, silver_key
from pgcdc_dagster.definitions import defs
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.names import partition_key, table_id
from pgcdc_dagster.postgres.statements import execute
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
SLOT = "pct_names"
PERCENT = ("%s", "a%2Fb")
TABLES = {  # (schema, table): its non-key columns
    PERCENT: ["v%", "%(k)s"],
    ("pct%(k)s", "{}"): ["{0}", "%%"],
    ("public", "50%%"): ["v"],
    ("a.b", "c"): ["v"],
    ("a", "b.c"): ["v"],
}
ROWS = {PERCENT: 40, ("pct%(k)s", "{}"): 12, ("public", "50%%"): 7, ("a.b", "c"): 11,
        ("a", "b.c"): 5}


def _ident(*names: str) -> sql.Identifier:
    return sql.Identifier(*names)


def _create(cur) -> None:
    for schema in sorted({s for s, _ in TABLES} - {"public"}):
        cur.execute(sql.SQL("CREATE SCHEMA {}").format(_ident(schema)))
    for (schema, table), cols in TABLES.items():
        cur.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, {})").format(
            _ident(schema, table),
            sql.SQL(", ").join(sql.SQL("{} text").format(_ident(c)) for c in cols)))
        values = sql.SQL(", ").join(sql.SQL("{} || g").format(sql.Literal(f"{c}=%s:"))
                                    for c in cols)
        cur.execute(sql.SQL("INSERT INTO {} SELECT g, {} FROM generate_series(1, {}) g").format(
            _ident(schema, table), values, sql.Literal(ROWS[(schema, table)])))


def _change(cur) -> None:
    """Per table: 2 inserts, 3 updates of every column, 1 delete (the dotted pair differently:
    ``"a.b".c`` gets 2 more inserts, ``a."b.c"`` 1 more delete)."""
    for (schema, table), cols in TABLES.items():
        t = _ident(schema, table)
        n = ROWS[(schema, table)]
        sets = sql.SQL(", ").join(sql.SQL("{} = {} || {}").format(_ident(c), _ident(c),
                                                                  sql.Literal("+%%"))
                                  for c in cols)
        # statements.execute: a composed statement holding these names, with parameters
        execute(cur, sql.SQL("INSERT INTO {} (id) VALUES ({}), ({})").format(
            t, sql.Placeholder(), sql.Placeholder()), (n + 1, n + 2))
        execute(cur, sql.SQL("UPDATE {} SET {} WHERE id <= {}").format(t, sets,
                                                                       sql.Placeholder()), (3,))
        execute(cur, sql.SQL("DELETE FROM {} WHERE id = {}").format(t, sql.Placeholder()), (5,))
    cur.execute('INSERT INTO "a.b".c (id, v) VALUES (100, \'x\'), (101, \'y\')')
    cur.execute('DELETE FROM a."b.c" WHERE id = 4')


def _dagster(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).parent / "dagster"
    proc = subprocess.run([str(cli), *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _export(lakehouse: Path, table: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pgcdc_dagster.export", "--lakehouse",
                           str(lakehouse), "--table", table, "--value-only"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _latest(instance: dg.DagsterInstance, key: dg.AssetKey) -> dict:
    records = instance.fetch_materializations(key, limit=1).records
    mat = records[0].asset_materialization
    assert mat is not None
    return {k: v.value for k, v in mat.metadata.items()}


def _incremental(lakehouse: Path, name: tuple[str, str]) -> list[int]:
    data = DeltaTable(table_uri(str(lakehouse), "bronze", *name)).to_pyarrow_table(
        columns=["op", "source", "after"]).to_pylist()
    return sorted(r["after"]["id"] for r in data
                  if r["op"] == "r" and r["source"]["snapshot"] == "incremental")


def test_percent_and_dotted_names_end_to_end(pg_dsn, pg_conn, lakehouse, tmp_path,
                                            monkeypatch) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        _create(cur)
        # what statements.execute avoids: psycopg2 formats the identifier's '%' too
        with pytest.raises((ValueError, TypeError, IndexError, KeyError)):
            cur.execute(sql.SQL("SELECT count(*) FROM {} WHERE id > %s").format(
                _ident(*PERCENT)), (0,))
        cur.execute("CREATE SCHEMA ops; CREATE TABLE ops.signals (id varchar(42) PRIMARY KEY, "
                    "type varchar(32) NOT NULL, data varchar(2048))")
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {"PGCDC_PG_DSN": pg_dsn, "PGCDC_LAKEHOUSE": str(lakehouse), "PGCDC_SLOT": SLOT,
           "PGCDC_PUBLICATION": SLOT, "PGCDC_SIGNAL_DATA_COLLECTION": "ops.signals",
           "PGCDC_TABLES": r"(?!ops\.).*", "DAGSTER_HOME": str(home)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cli_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}

    # 1. The initial snapshot and a micro-batch from a shell, as documented.
    _dagster(cli_env, "job", "execute", "-m", "pgcdc_dagster.definitions", "-j",
             "initial_snapshot")
    with pg_conn.cursor() as cur:
        _change(cur)
    _dagster(cli_env, "job", "execute", "-m", "pgcdc_dagster.definitions", "-j",
             "cdc_microbatch")
    instance = dg.DagsterInstance.get()
    for name in TABLES:
        assert assert_silver_equals_source(
            pg_conn, table_uri(str(lakehouse), "silver", *name), *name, ["id"]) \
            == ROWS[name] + 1 + 2 * (name == ("a.b", "c")) - (name == ("a", "b.c")), name
        meta = _latest(instance, bronze_key(*name))
        expected = (2 + 2 * (name == ("a.b", "c")), 3, 1 + (name == ("a", "b.c")))
        assert (meta["events_c"], meta["events_u"], meta["events_d"]) == expected, name
    assert table_id("a.b", "c") != table_id("a", "b.c")

    # 2. An incremental snapshot of a '%' table: chunks of 4, a filter holding '%'.
    loaded = defs()
    percent = partition_key(*PERCENT)
    assert percent in instance.get_dynamic_partitions("pgcdc_incremental_tables")
    condition = """"v%" LIKE 'v\\%%' AND id % 2 = 0 AND "%(k)s" NOT LIKE '%x%'"""
    result = loaded.resolve_job_def("incremental_snapshot").execute_in_process(
        instance=instance, partition_key=percent, run_config={"ops": {"incremental__snapshot": {
            "config": {"chunk_size": 4, "additional_condition": condition}}}})
    assert result.success
    with pg_conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT id FROM {} WHERE " + condition + " ORDER BY id").format(
            _ident(*PERCENT)))
        wanted = [r[0] for r in cur.fetchall()]
    assert len(wanted) > 8 and _incremental(lakehouse, PERCENT) == wanted
    assert all(not _incremental(lakehouse, n) for n in TABLES if n != PERCENT)

    # 3. The signalling table names one dotted table by its quoted form; an ambiguous entry
    # is refused with the quoted forms named.
    sensor = loaded.resolve_sensor_def("signal_table_sensor")
    ticks = []
    for sid, entry in (("sig-1", '"a.b".c'), ("sig-2", "a\\.b\\.c")):
        with pg_conn.cursor() as cur:
            cur.execute("INSERT INTO ops.signals VALUES (%s, 'execute-snapshot', %s)",
                        (sid, json.dumps({"data-collections": [entry]})))
        with dg.build_sensor_context(instance=instance, resources=loaded.resources,
                                     cursor=ticks[-1].cursor if ticks else None) as context:
            tick = sensor(context)
        assert isinstance(tick, dg.SensorResult)
        ticks.append(tick)
    assert [r.partition_key for r in ticks[0].run_requests or []] == [
        partition_key("a.b", "c")]
    assert not ticks[1].run_requests
    assert """'a\\.b\\.c' is ambiguous: "a.b".c and a."b.c" both read as 'a.b.c'""" in \
        ticks[1].skip_reason.skip_message  # type: ignore[union-attr]
    result = loaded.resolve_job_def("incremental_snapshot").execute_in_process(
        instance=instance, partition_key=partition_key("a.b", "c"))
    assert result.success
    assert _incremental(lakehouse, ("a.b", "c")) == sorted(
        [i for i in range(1, ROWS[("a.b", "c")] + 3) if i != 5] + [100, 101])
    assert not _incremental(lakehouse, ("a", "b.c"))
    mats = instance.fetch_materializations(INCREMENTAL_KEY, limit=10).records
    assert {r.asset_materialization.partition for r in mats  # type: ignore[union-attr]
            } == {percent, partition_key("a.b", "c")}

    # 3b. From a shell, with a table whose partition no bronze run of this instance added
    # (as on a fresh DAGSTER_HOME, or any `dagster job execute` without one): the run adds
    # the captured tables' partitions itself; a key naming no captured table is refused by
    # name (both were Dagster's 'Nonexistent partition keys' error).
    dotted = partition_key("a", "b.c")
    instance.delete_dynamic_partition("pgcdc_incremental_tables", dotted)
    shell = [str(Path(sys.executable).parent / "dagster"), "job", "execute", "-m",
             "pgcdc_dagster.definitions", "-j", "incremental_snapshot", "--tags"]
    _dagster(cli_env, *shell[1:], json.dumps({"dagster/partition": dotted}))
    with pg_conn.cursor() as cur:
        cur.execute('SELECT id FROM a."b.c" ORDER BY id')
        assert _incremental(lakehouse, ("a", "b.c")) == [r[0] for r in cur.fetchall()]
    proc = subprocess.run([*shell, json.dumps({"dagster/partition": "a.nosuch"})],
                          env=cli_env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "partition 'a.nosuch' of incremental/snapshot is not a captured table" in \
        proc.stdout + proc.stderr

    # 4. Every check passes, for every table; silver still equals the source.
    result = loaded.resolve_job_def("capture_checks").execute_in_process(instance=instance)
    assert result.success
    evaluations = result.get_asset_check_evaluations()
    for name in TABLES:
        for key, check in ((silver_key(*name), "matches_source"),
                           (silver_key(*name), "schema_matches_source"),
                           (bronze_key(*name), "lsn_windows_contiguous")):
            found = [e for e in evaluations if e.asset_key == key and e.check_name == check]
            assert found and found[0].passed, (name, check, found)
        assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", *name), *name,
                                    ["id"])

    # 5. The export CLI: a quoted --table picks one table; the plain one is ambiguous.
    for name in (("a.b", "c"), ("a", "b.c"), PERCENT):
        proc = _export(lakehouse, table_id(*name))
        assert proc.returncode == 0, proc.stderr
        bronze = DeltaTable(table_uri(str(lakehouse), "bronze", *name)).to_pyarrow_table()
        lines = proc.stdout.splitlines()
        assert len(lines) - lines.count("null") == bronze.num_rows  # "null": tombstones
    proc = _export(lakehouse, "a.b.c")
    assert proc.returncode == 2 and 'ambiguous' in proc.stderr
    assert 'a."b.c"' in proc.stderr and '"a.b".c' in proc.stderr

    # 6. Teardown drops the slot and the publication whatever the tables are named.
    result = loaded.resolve_job_def("teardown").execute_in_process(
        instance=instance, run_config={"ops": {"drop_slot_and_publication": {
            "config": {"confirm": SLOT}}}})
    assert result.success
    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s), "
                    "(SELECT count(*) FROM pg_publication WHERE pubname = %s)", (SLOT, SLOT))
        assert cur.fetchone() == (0, 0)
    conn.close()
