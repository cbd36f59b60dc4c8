"""The Dagster surface of the walking skeleton: lazy definitions, jobs in process and by CLI."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable

from pgcdc_dagster import definitions
from pgcdc_dagster.definitions import build_definitions, defs, discover_tables
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.postgres.local_cluster import free_port
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)
from tests.support.compare import assert_silver_equals_source
from tests.support.processes import MARK, left_behind, marked

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
SETUP = """
CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8,2), seen timestamptz);
CREATE TABLE tags (item_id int, tag text, weight bigint, PRIMARY KEY (item_id, tag));
INSERT INTO items SELECT g, 'item ' || g, g * 0.5, now() FROM generate_series(1, 200) g;
INSERT INTO tags SELECT g, 't' || (g % 5), g FROM generate_series(1, 100) g;
"""
CHANGES = """
UPDATE items SET price = price + 1 WHERE id <= 50;
DELETE FROM items WHERE id > 190;
INSERT INTO items VALUES (1000, 'new', 9.99, now());
DELETE FROM tags WHERE item_id <= 10;
INSERT INTO tags VALUES (1000, 'fresh', -1);
"""


def _materializations(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    out = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization  # type: ignore[union-attr]
        out["/".join(mat.asset_key.path)] = {k: v.value for k, v in mat.metadata.items()}
    return out


def test_jobs_in_process(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SETUP)
    tables = discover_tables(pg_dsn, ["public\\..*"])
    assert tables == [("public", "items"), ("public", "tags")]
    definitions = build_definitions(tables, {
        "postgres": PostgresResource(dsn=pg_dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables="public\\..*", slot="dg_inproc",
                                   publication="dg_inproc", target_file_bytes=4096),
        "spark": SparkResource(),
    })
    keys = {"/".join(k.path) for k in definitions.resolve_all_asset_keys()}
    assert {"bronze/public/items", "silver/public/items", "bronze/public/tags",
            "silver/public/tags", "source/public/items"} <= keys

    result = definitions.resolve_job_def("initial_snapshot").execute_in_process()
    assert result.success
    mats = _materializations(result)
    assert mats["bronze/public/items"]["snapshot_rows"] == 200
    assert mats["bronze/public/items"]["capture_kind"] == "snapshot"  # stream wrote nothing
    assert mats["silver/public/tags"]["delta_version"] == 0  # created by the snapshot commit

    with pg_conn.cursor() as cur:
        cur.execute(CHANGES)
    result = definitions.resolve_job_def("cdc_microbatch").execute_in_process()
    assert result.success
    mats = _materializations(result)
    items = mats["bronze/public/items"]
    assert (items["events_c"], items["events_u"], items["events_d"]) == (1, 50, 10)
    assert mats["bronze/public/tags"]["events_d"] == 10
    assert mats["silver/public/items"]["events"] == 61
    for table, key in (("items", ["id"]), ("tags", ["item_id", "tag"])):
        uri = table_uri(str(lakehouse), "silver", "public", table)
        assert_silver_equals_source(pg_conn, uri, "public", table, key)

    # target_file_bytes (PGCDC_TARGET_FILE_BYTES) sizes the files the micro-batch's silver
    # merge writes too, not only the snapshot's: 500 new rows of ~100 bytes land in several
    # files of about 8 KiB (the default 1 MiB wrote them as one).
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO items SELECT g, repeat('n', 60), g, now() "
                    "FROM generate_series(2000, 2499) g")
    assert definitions.resolve_job_def("cdc_microbatch").execute_in_process().success
    silver = DeltaTable(table_uri(str(lakehouse), "silver", "public", "items"))
    added = set(silver.file_uris()) - set(
        DeltaTable(silver.table_uri, version=silver.version() - 1).file_uris())
    assert len(added) >= 2, added
    assert_silver_equals_source(pg_conn, silver.table_uri, "public", "items", ["id"])


def _cli_env(dsn: str, lakehouse: Path, home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PGCDC_PG_DSN": dsn, "PGCDC_LAKEHOUSE": str(lakehouse), "PGCDC_TABLES": "public\\..*",
        "PGCDC_SLOT": "dg_cli", "PGCDC_PUBLICATION": "dg_cli", "DAGSTER_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
    })
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return env


def _dagster_job(env: dict[str, str], job: str, output: list[str] | None = None,
                 alive_at_exit: list[str] | None = None) -> set[str]:
    """Run ``dagster job execute``; return the modules the process imported (``output``
    receives the lines the process printed, ``alive_at_exit`` the command lines of the
    processes carrying the environment's mark still running when it had ended). Its output
    goes to files: a pipe would be held open by the processes it started."""
    cli = Path(sys.executable).parent / "dagster"
    out_path, err_path = (Path(env["DAGSTER_HOME"]) / f"{job}.{name}" for name in ("out", "err"))
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", str(cli), "job", "execute", "-m",
             "pgcdc_dagster.definitions", "-j", job],
            env=env, cwd=ROOT, stdout=out, stderr=err, text=True, timeout=600)
    if alive_at_exit is not None and MARK in env:
        alive_at_exit.extend(_command_line(pid) for pid in marked(env[MARK]))
    stdout, stderr = out_path.read_text(), err_path.read_text()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "RUN_SUCCESS" in stdout + stderr
    # The beta parameters the project uses on purpose (owners, backfill_policy) print no
    # warning on a user's terminal.
    assert "BetaWarning" not in stderr, stderr[-3000:]
    if output is not None:
        output.extend((stdout + stderr).splitlines())
    return {line.split("|")[-1].strip() for line in stderr.splitlines()
            if line.startswith("import time:")}


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_dagster_job_execute_from_a_shell(pg_dsn, pg_conn, lakehouse, tmp_path,
                                         monkeypatch) -> None:
    with pg_conn.cursor() as cur:  # notes: matched, but keyless, so left out with a warning
        cur.execute(SETUP + "CREATE TABLE notes (body text); INSERT INTO notes VALUES ('x');")
    env = _cli_env(pg_dsn, lakehouse, tmp_path / "dagster_home")
    env[MARK] = uuid.uuid4().hex
    lines: list[str] = []
    alive: list[str] = []
    # A snapshot this small (under snapshot_spark_threshold_rows) reads its chunks in the
    # run's process: with no Java to start, Spark would fail.
    no_java = {**env, "JAVA_HOME": str(tmp_path / "no-java")}
    _dagster_job(no_java, "initial_snapshot", lines, alive)
    # Nothing the run started outlives it.
    assert left_behind(env[MARK]) == []
    assert not [c for c in alive if "java" in c.split(" ")[0]], alive
    # The warning about the table left out: once on the terminal and once in the run's
    # events (the code's load, which every run's process does, notes it at INFO only).
    warning = "1 table(s) matched by the include list are left out of capture"
    assert sum(warning in line for line in lines) == 1, [x for x in lines if warning in x]
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        run = instance.get_runs(limit=1)[0]
        logged = [e for e in instance.all_logs(run.run_id)
                  if warning in (e.user_message or "")]
    assert [e.level for e in logged] == [logging.WARNING]
    assert "public.notes: no primary key" in logged[0].user_message
    timeline = [line.split("snapshot timeline (s from the step's start): ")[1]
                for line in lines if "snapshot timeline" in line]
    assert len(timeline) == 1, lines[-40:]
    assert "spark" not in timeline[0] and "without Spark" in "\n".join(lines), timeline
    # A micro-batch without Spark work starts no JVM: with no Java to start, it
    # would fail. Idle first, then a few changes (far under the silver Spark threshold).
    _dagster_job(no_java, "cdc_microbatch")
    with pg_conn.cursor() as cur:
        cur.execute(CHANGES)
    imported = _dagster_job(no_java, "cdc_microbatch")
    # The stream path imports no Spark, no SQL parser, no protobuf (the code
    # location loads and the run works without them; they come with a snapshot, a filter,
    # decoderbufs).
    assert "pgcdc_dagster.capture.stream" in imported
    assert not {m for m in imported if m.split(".")[0] in ("pyspark", "pglast")}
    assert "pgcdc_dagster.cdc.plugins.decoderbufs" not in imported
    for table, key in (("items", ["id"]), ("tags", ["item_id", "tag"])):
        uri = table_uri(str(lakehouse), "silver", "public", table)
        assert_silver_equals_source(pg_conn, uri, "public", table, key)
    # version 0: the snapshot (its commit creates the table); then the changes
    assert DeltaTable(table_uri(str(lakehouse), "bronze", "public", "items")).version() >= 1
    # The CLI processes built their job only; the UI's full definitions (same environment)
    # show those runs as runs of the same jobs, and their materializations on the assets.
    for name, value in env.items():
        if name.startswith("PGCDC_"):
            monkeypatch.setenv(name, value)
    full = build_definitions([("public", "items"), ("public", "tags")])
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        runs = instance.get_runs()
        assert sorted(r.job_name for r in runs) == \
            ["cdc_microbatch", "cdc_microbatch", "initial_snapshot"]
        for run in runs:
            assert run.job_snapshot_id == \
                full.resolve_job_def(run.job_name).get_job_snapshot_id()
        latest = instance.get_latest_materialization_event(
            dg.AssetKey(["silver", "public", "items"]))
        assert latest is not None and latest.run_id == runs[0].run_id
        assert latest.asset_materialization.metadata["events"].value == 61  # type: ignore[union-attr]


def test_a_process_executing_one_lean_job_builds_that_job_only(monkeypatch) -> None:
    """``dagster job execute -j cdc_microbatch`` (or the run worker of such a run)
    builds the job it executes and the resources, not the assets, checks, schedules and
    sensors of every captured table; the job is the one the full definitions define (same
    snapshot: the UI shows the run as a run of its job). Any other process builds all."""
    tables = [("public", f"t{i}") for i in range(4)] + [("odd schema", "a.b")]
    monkeypatch.setenv("PGCDC_PG_DSN", "host=127.0.0.1 dbname=x user=y")
    full = build_definitions(tables)
    assert len(list(full.resolve_all_asset_keys())) > 2 * len(tables)
    for job in ("initial_snapshot", "cdc_microbatch", "capture_checks"):
        for argv in (["dagster", "job", "execute", "-m", "pgcdc_dagster.definitions", "-j",
                      job],
                     ["dagster", "api", "execute_run",
                      '{"job_origin": {"job_name": "' + job + '"}}']):
            monkeypatch.setattr(sys, "argv", argv)
            lean = definitions._built.__wrapped__(tuple(tables), ())  # type: ignore[attr-defined]
            assert list(lean.resolve_all_asset_keys()) == []
            assert not lean.schedules and not lean.sensors
            assert [j.name for j in lean.resolve_all_job_defs()
                    if not j.name.startswith("__")] == [job]
            assert lean.resolve_job_def(job).get_job_snapshot_id() == \
                full.resolve_job_def(job).get_job_snapshot_id()
    for argv in (["dagster", "job", "execute", "-m", "pgcdc_dagster.definitions", "-j",
                  "incremental_snapshot"], ["dagster", "dev"], ["pytest"]):
        monkeypatch.setattr(sys, "argv", argv)
        built = definitions._built.__wrapped__(tuple(tables), ())  # type: ignore[attr-defined]
        assert len(list(built.resolve_all_asset_keys())) == \
            len(list(full.resolve_all_asset_keys()))


def test_the_code_location_loads_with_the_source_stopped(monkeypatch, tmp_path) -> None:
    """A source that does not answer fails the capture runs, naming it, never the load: the
    definitions hold the tables cached in PGCDC_CATALOG (none here) and the slot's assets."""
    port = free_port()
    monkeypatch.setenv("PGCDC_PG_DSN", f"host=127.0.0.1 port={port} dbname=x user=y "
                                       "password=topsecret")
    monkeypatch.setenv("PGCDC_LAKEHOUSE", str(tmp_path / "lake"))
    loaded = defs()  # what the code location loader calls
    assert dg.AssetKey(["source", "replication_slot"]) in \
        loaded.resolve_asset_graph().get_all_asset_keys()
    with dg.instance_for_test() as instance:
        result = loaded.resolve_job_def("cdc_microbatch").execute_in_process(
            instance=instance, raise_on_error=False)
    assert not result.success
    failure = " ".join(str(e.event_specific_data.error)  # type: ignore[union-attr]
                       for e in result.all_events if e.is_step_failure)
    assert f"port={port}" in failure and "cannot connect to the source" in failure, failure
    assert "topsecret" not in failure
    monkeypatch.delenv("PGCDC_PG_DSN")
    with pytest.raises(ConfigurationError, match="PGCDC_PG_DSN is not set"):
        defs()


_SILVER_KEYS = ("from pgcdc_dagster.definitions import defs\n"
                "keys = sorted('/'.join(k.path) for k in defs().resolve_all_asset_keys()\n"
                "              if k.path[0] == 'silver')\n"
                "print('|'.join(keys))\n")


def test_reload_picks_up_new_tables(pg_dsn, pg_conn, monkeypatch) -> None:
    """The catalog is read once per code-location process (Dagster reconstructs the location
    several times in one run), and a reload, which starts a new code-server process, sees the
    tables created since."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE first_table (id int PRIMARY KEY)")
    monkeypatch.setenv("PGCDC_PG_DSN", pg_dsn)
    monkeypatch.setenv("PGCDC_TABLES", "public\\..*")

    def reloaded_silver_keys() -> set[str]:
        proc = subprocess.run([sys.executable, "-c", _SILVER_KEYS], cwd=ROOT, env=os.environ,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return set(proc.stdout.strip().splitlines()[-1].split("|"))

    assert reloaded_silver_keys() == {"silver/public/first_table"}
    loaded = defs()
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE second_table (id int PRIMARY KEY)")
    reads: list[object] = []
    discover = definitions.discover_tables
    monkeypatch.setattr(definitions, "discover_tables",
                        lambda *a, **k: reads.append(a) or discover(*a, **k))
    for _ in range(3):  # reconstructions within one process: no new catalog read
        assert defs() is loaded
    assert reads == []
    assert reloaded_silver_keys() == {"silver/public/first_table", "silver/public/second_table"}
