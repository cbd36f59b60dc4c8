"""Bad input gets clear errors naming the problem and the fix."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from pgcdc_dagster.exceptions import (
    ConfigurationError,
    MissingPrimaryKeyError,
    SourceUnavailableError,
    TableNotFoundError,
)
from pgcdc_dagster.postgres.connection import connect, connection
from pgcdc_dagster.postgres.discovery import check_server, resolve_tables
from pgcdc_dagster.postgres.local_cluster import LocalCluster, free_port

pytestmark = pytest.mark.integration


def test_unreachable_dsn_is_named_without_the_password() -> None:
    dsn = f"host=127.0.0.1 port={free_port()} dbname=app user=cdc password=s3cret-value"
    with pytest.raises(SourceUnavailableError) as err:
        connect(dsn)
    message = str(err.value)
    assert "cannot connect to the source PostgreSQL" in message
    assert "port=" in message and "PGCDC_PG_DSN" in message
    assert "s3cret-value" not in message


def test_wal_level_not_logical_is_refused_with_the_fix() -> None:
    root = Path(tempfile.mkdtemp(prefix="pgcdc-replica-"))
    cluster = LocalCluster(root / "pg", overrides={"wal_level": "replica"}).start()
    try:
        with connection(cluster.dsn) as conn, pytest.raises(ConfigurationError) as err:
            check_server(conn)
        assert "wal_level = 'replica'" in str(err.value)
        assert "ALTER SYSTEM SET wal_level = logical" in str(err.value)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_include_list_errors(pg_conn) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE keyed (id int PRIMARY KEY, v text)")
        cur.execute("CREATE TABLE keyless (v text)")
    with pytest.raises(TableNotFoundError, match=r"nothere.*|no table"):
        resolve_tables(pg_conn, ["public\\.nothere"])
    with pytest.raises(MissingPrimaryKeyError, match="ADD PRIMARY KEY"):
        resolve_tables(pg_conn, ["public\\.keyless"])
    with pytest.raises(ConfigurationError, match="not a valid regular expression"):
        resolve_tables(pg_conn, ["public\\.(unclosed"])
    relations = resolve_tables(pg_conn, ["public\\.keyed"])
    assert [r.qualified for r in relations] == [("public", "keyed")]
    assert relations[0].key_names == ("id",)


def test_replica_identity_index_serves_as_key(pg_conn) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE ri (a int NOT NULL, b int NOT NULL, v text)")
        cur.execute("CREATE UNIQUE INDEX ri_ab ON ri (b, a)")
        cur.execute("ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_ab")
    (rel,) = resolve_tables(pg_conn, ["public\\.ri"])
    assert rel.key_names == ("a", "b")
    assert rel.replica_identity == "i"
