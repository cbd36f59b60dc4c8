"""Session fixtures: a throwaway PostgreSQL, one local Spark session, lakehouse dirs.

``PGCDC_TEST_DSN`` points the tests at an existing server (it needs wal_level=logical and a
role allowed to create databases, slots and publications) instead of starting one.
``PGCDC_TEST_SSLMODE=require`` starts the server with TLS (a self-signed certificate) and
connects every test with ``sslmode=require``: the same tests, over encrypted connections.
``PGCDC_TEST_PG_VERSION`` (14-18) picks the major version of the server the fixtures start
(default: the system's newest; ``scripts/install_pg.sh`` installs the others).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import pytest

from pgcdc_dagster.postgres.local_cluster import LocalCluster, tls_overrides
from tests.support.ha import requested_pg_major

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
if "DAGSTER_HOME" not in os.environ:
    os.environ["DAGSTER_HOME"] = tempfile.mkdtemp(prefix="pgcdc-dagster-home-")
    atexit.register(shutil.rmtree, os.environ["DAGSTER_HOME"], ignore_errors=True)
_dagster_yaml = Path(os.environ["DAGSTER_HOME"]) / "dagster.yaml"
if not _dagster_yaml.exists():
    _dagster_yaml.write_text("telemetry:\n  enabled: false\n")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """DSN of the server's maintenance database (``postgres``)."""
    external = os.environ.get("PGCDC_TEST_DSN")
    if external:
        yield external
        return
    root = Path(tempfile.mkdtemp(prefix="pgcdc-test-pg-"))
    sslmode = os.environ.get("PGCDC_TEST_SSLMODE", "")
    tls = tls_overrides(root / "certs") if sslmode == "require" else {}
    cluster = LocalCluster(root / "pg", major=requested_pg_major(), overrides=tls).start()
    try:
        yield f"{cluster.dsn} sslmode={sslmode}" if sslmode else cluster.dsn
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _with_dbname(dsn: str, dbname: str) -> str:
    parts = [p for p in dsn.split() if not p.startswith("dbname=")]
    return " ".join([*parts, f"dbname={dbname}"])


@contextmanager
def fresh_database(server: str) -> Iterator[str]:
    """A fresh, empty database; its slots are dropped and it is removed after."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(server)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_dbname(server, name)
    finally:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE database = %s AND active_pid IS NOT NULL", (name,))
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s", (name,))
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def pg_dsn(pg_server: str) -> Iterator[str]:
    """A fresh, empty database for one test; its slots are dropped and it is removed after."""
    with fresh_database(pg_server) as dsn:
        yield dsn


@pytest.fixture
def second_pg_dsn(pg_server: str) -> Iterator[str]:
    """Another fresh, empty database for the same test."""
    with fresh_database(pg_server) as dsn:
        yield dsn


@pytest.fixture
def pg_conn(pg_dsn: str) -> Iterator[psycopg2.extensions.connection]:
    """An autocommit connection to the test's fresh database."""
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture(scope="session")
def spark():
    """One local[2] Spark session for the whole test session."""
    from pgcdc_dagster.spark.session import build_session

    session = build_session(master="local[2]", app_name="pgcdc-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_connect_server():
    """One Spark Connect server (pyspark's own jars, local[2]) for the whole test session."""
    from tests.support import spark_connect

    server = spark_connect.start()
    yield server
    server.stop()


@pytest.fixture
def lakehouse(tmp_path: Path) -> Path:
    """An empty lakehouse root for one test."""
    path = tmp_path / "lakehouse"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def s3_server():
    """A local S3-compatible server (moto, loopback, a free port) for the whole session."""
    from tests.support import s3_server as server

    running = server.start()
    yield running
    running.stop()


@pytest.fixture
def s3_lakehouse(s3_server, monkeypatch) -> str:
    """An empty ``s3://`` lakehouse on the local server; the standard AWS variables point at it
    for this test (and the child processes it starts)."""
    from pgcdc_dagster.lake import commit_safety

    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    commit_safety.forget_checks()
    yield f"s3://{bucket}/lakehouse"
    commit_safety.forget_checks()
