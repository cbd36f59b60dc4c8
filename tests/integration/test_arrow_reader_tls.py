"""The Arrow reader takes the same path over TLS (``sslmode=require``) as without: libpq
encrypts, the reader sees the same batches (a managed PostgreSQL asks for TLS)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from psycopg2 import sql

from pgcdc_dagster.postgres.arrow_reader import ArrowSnapshot, read_batches
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.local_cluster import LocalCluster, tls_overrides

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("tls-cluster")
    cluster = LocalCluster(root / "pg", overrides=tls_overrides(root / "certs")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_tls_and_plain_read_the_same_batches(tls_cluster: LocalCluster) -> None:
    with connection(tls_cluster.dsn) as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS t; CREATE TABLE t AS SELECT g AS id, "
                    "repeat('é', g % 50) AS s, g * 0.5 AS f FROM generate_series(1, 50000) g")
    query = sql.SQL("SELECT id, s, f FROM {} ORDER BY id").format(sql.Identifier("t"))
    tables = {}
    for mode in ("require", "disable"):
        dsn = f"{tls_cluster.dsn} sslmode={mode}"
        with ArrowSnapshot(dsn, None) as reader:
            (row,) = reader.batches("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            assert row.column(0).to_pylist() == [mode == "require"]
        tables[mode] = pa.Table.from_batches(list(read_batches(dsn, None, query,
                                                               batch_bytes=64 << 10)))
    assert tables["require"].num_rows == 50000
    assert tables["require"].equals(tables["disable"])
