"""The user's path on object storage, end to end.

Every step is ``dagster job execute -m pgcdc_dagster.definitions -j <job>`` in a subprocess
whose environment holds only what a user sets (PATH, HOME, JAVA_HOME, DAGSTER_HOME, the
documented ``PGCDC_*`` and ``AWS_*`` variables), pointed at a local S3-compatible server
(moto, loopback): ``PGCDC_LAKEHOUSE=s3://bucket/lakehouse``. The shared scenario
(:mod:`tests.support.e2e_scenario`) runs through it: ``initial_snapshot``, ``cdc_microbatch``
over inserts, updates, deletes and a TRUNCATE, a ``cdc_microbatch`` SIGKILLed after its
bronze commit and its rerun, an ``incremental_snapshot`` of one table (its progress files
in the bucket), silver equal to the source, tables read from the bucket by delta-rs, Polars
and DuckDB. Then ``silver_maintenance`` compacts silver in the bucket and a vacuum deletes
the replaced files, and ``capture_checks`` finds silver equal to the source (values and
schema) reading it from the bucket. The secret key never appears in any run's output, nor
anywhere under DAGSTER_HOME (event log, run storage, compute logs), nor in the bucket.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.assets.checks import MATCHES_SOURCE, SCHEMA_MATCHES
from pgcdc_dagster.capture.faults import ENV as FAULT_ENV
from pgcdc_dagster.capture.incremental_state import ProgressStore
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.storage import filesystem, storage_options
from pgcdc_dagster.names import asset_path
from tests.support import e2e_scenario
from tests.support.compare import assert_silver_equals_source
from tests.support.s3_server import SECRET_KEY

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
SLOT = "s3cli"
USER_ENV = ("PATH", "HOME", "JAVA_HOME", "TMPDIR", "LANG", "LC_ALL")
"""What a user's shell has anyway; nothing else of the test process reaches the runs."""


class CliSteps:
    """The scenario's steps as ``dagster job execute`` runs; keeps every run's output."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.outputs: list[str] = []

    def job(self, name: str, *args: str, extra: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        cli = Path(sys.executable).parent / "dagster"
        proc = subprocess.run(
            [str(cli), "job", "execute", "-m", "pgcdc_dagster.definitions", "-j", name, *args],
            env={**self.env, **(extra or {})}, cwd=ROOT, capture_output=True, text=True,
            timeout=600)
        self.outputs.append(proc.stdout + proc.stderr)
        return proc

    def succeed(self, name: str, *args: str) -> None:
        proc = self.job(name, *args)
        assert proc.returncode == 0 and "RUN_SUCCESS" in proc.stdout + proc.stderr, \
            (proc.stdout + proc.stderr)[-4000:]

    def snapshot(self) -> None:
        self.succeed("initial_snapshot")

    def microbatch(self) -> None:
        self.succeed("cdc_microbatch")

    def killed_microbatch(self) -> None:
        proc = self.job("cdc_microbatch", extra={FAULT_ENV: "after_bronze_commit"})
        assert proc.returncode == -signal.SIGKILL, (proc.stdout + proc.stderr)[-4000:]

    def incremental(self, table: str) -> None:
        self.succeed("incremental_snapshot", "--tags",
                     json.dumps({"dagster/partition": f"public.{table}"}))


def user_env(pg_dsn: str, lake: str, aws: dict[str, str], home: Path) -> dict[str, str]:
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {k: os.environ[k] for k in USER_ENV if k in os.environ}
    env.update(aws)  # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL,
    env.update({  # AWS_ALLOW_HTTP (loopback http), as docs/operations.md lists them
        "PYTHONPATH": str(ROOT),  # this checkout's code (an installed package needs none)
        "DAGSTER_HOME": str(home), "PGCDC_PG_DSN": pg_dsn, "PGCDC_LAKEHOUSE": lake,
        "PGCDC_TABLES": e2e_scenario.INCLUDE, "PGCDC_SLOT": SLOT, "PGCDC_PUBLICATION": SLOT,
        "PGCDC_INCREMENTAL_CHUNK_SIZE": str(e2e_scenario.INCREMENTAL_CHUNK),
    })
    return env


def test_dagster_jobs_on_object_storage(pg_dsn, pg_conn, s3_server, s3_lakehouse,
                                        tmp_path) -> None:
    lake = s3_lakehouse
    home = tmp_path / "dagster_home"
    steps = CliSteps(user_env(pg_dsn, lake, s3_server.env(), home))
    e2e_scenario.run(steps, pg_conn, lake)
    assert [p.status for p in ProgressStore(lake, SLOT).all()] == ["done"]  # in the bucket

    # Nothing of the lakehouse on local disk; everything the capture keeps is in the bucket.
    assert not (ROOT / "s3:").exists()
    fs, base = filesystem(lake)
    stored = [i.path for i in fs.get_file_info(pafs.FileSelector(base, recursive=True))
              if i.type == pafs.FileType.File]
    assert {p[len(base) + 1:].split("/")[0] for p in stored} == {"bronze", "silver", "_pgcdc"}
    assert any(f"_pgcdc/{SLOT}/incremental/" in p for p in stored)

    # The asset checks read silver and bronze from the bucket (and the source) too.
    steps.succeed("capture_checks")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_event_records(
            dg.EventRecordsFilter(dg.DagsterEventType.ASSET_CHECK_EVALUATION))
        evaluations = {(tuple(e.asset_key.path), e.check_name): e for e in (
            r.event_log_entry.dagster_event.event_specific_data  # type: ignore[union-attr]
            for r in records)}
    failed = {k: (e.description, {n: v.value for n, v in e.metadata.items()})
              for k, e in evaluations.items() if not e.passed}
    for table, _ in e2e_scenario.TABLES:
        for check in (MATCHES_SOURCE, SCHEMA_MATCHES):
            key = (tuple(asset_path("silver", "public", table)), check)
            assert key in evaluations and key not in failed, (key, failed)

    # Silver upkeep in the bucket: the maintenance job compacts, a vacuum deletes what was
    # replaced (the job keeps a retention of at least an hour).
    uri = table_uri(lake, "silver", "public", "events")
    before = DeltaTable(uri, storage_options=storage_options(uri))
    steps.succeed("silver_maintenance")
    after = DeltaTable(uri, storage_options=storage_options(uri))
    assert after.version() > before.version()
    assert len(after.file_uris()) < len(before.file_uris())
    from pgcdc_dagster.lake.upkeep import vacuum

    assert vacuum(uri, 0) >= len(set(before.file_uris()) - set(after.file_uris()))
    assert_silver_equals_source(pg_conn, uri, "public", "events", ["id"])

    # The secret reached no run's output, nothing under DAGSTER_HOME, nothing in the bucket.
    assert len(steps.outputs) == 7
    for output in steps.outputs:
        assert SECRET_KEY not in output
    for path in home.rglob("*"):
        if path.is_file():
            assert SECRET_KEY.encode() not in path.read_bytes(), path
    for info in fs.get_file_info(pafs.FileSelector(base, recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        with fs.open_input_stream(info.path) as stream:
            assert SECRET_KEY.encode() not in stream.read(), info.path
