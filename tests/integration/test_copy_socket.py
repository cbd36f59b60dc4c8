"""Snapshot COPY read from the socket (issue 5): the same rows as libpq gives, server errors
translated, the transaction left usable, and encrypted connections read through libpq."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.errors
import pytest
from psycopg2 import sql

from pgcdc_dagster.cdc.copy_columns import RowSpans
from pgcdc_dagster.postgres import binary_read, copy_socket
from pgcdc_dagster.postgres.local_cluster import LocalCluster
from pgcdc_dagster.postgres.snapshot_read import TableVanishedError

# Bytes that look like the start of a row message of this 3-column query: 'd', a length, 3.
DECOY_HEX = "'6400000020000364000000060003'"


@pytest.fixture
def socket_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records each COPY read from the socket (the real reader runs)."""
    calls: list[str] = []
    real: Callable[..., None] = copy_socket.copy_out

    def counted(conn: Any, query: str, *args: Any, **kwargs: Any) -> None:
        calls.append(query)
        real(conn, query, *args, **kwargs)

    monkeypatch.setattr(copy_socket, "copy_out", counted)
    return calls


@pytest.fixture
def low_water(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records each low-water mark the reader sets on the socket (the real one is set)."""
    marks: list[int] = []
    real: Callable[[socket.socket, int], None] = copy_socket._low_water

    def recorded(sock: socket.socket, size: int) -> None:
        marks.append(size)
        real(sock, size)

    monkeypatch.setattr(copy_socket, "_low_water", recorded)
    return marks


def _rows(dsn: str, query: sql.Composable, *, socket: bool, batch_bytes: int = 1 << 16
          ) -> list[bytes]:
    binary_read.USE_SOCKET = socket
    try:
        out: list[bytes] = []
        for spans in binary_read.read_binary_rows(dsn, None, query, batch_bytes=batch_bytes):
            assert isinstance(spans, RowSpans) and len(spans)
            out.extend(spans.rows())
        return out
    finally:
        binary_read.USE_SOCKET = True


def test_socket_and_libpq_read_the_same_rows(pg_dsn: str, pg_conn: Any,
                                             socket_calls: list[str],
                                             low_water: list[int]) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(f"""CREATE TABLE t AS SELECT g AS id,
                          CASE WHEN g % 7 = 0 THEN NULL
                               ELSE decode(repeat({DECOY_HEX}, g % 5), 'hex') END AS b,
                          CASE WHEN g % 1000 = 1 THEN repeat('dd', 300000)
                               ELSE 'ünïcødé ' || g END AS s
                        FROM generate_series(1, 30000) g""")
    query = sql.SQL("SELECT id, b, s FROM t ORDER BY id")
    plain = _rows(pg_dsn, query, socket=True)
    assert len(socket_calls) == 1
    # a large reply is received a quarter megabyte per wake-up once it proved large
    assert low_water == [copy_socket.LOW_WATER, 1]
    assert plain == _rows(pg_dsn, query, socket=False)
    assert len(socket_calls) == 1 and len(plain) == 30000
    # 600 kB values are larger than the 64 KiB buffers: they were received whole
    assert max(map(len, plain)) > 600_000


def test_server_error_during_copy_is_raised_as_libpq_would(pg_dsn: str,
                                                           socket_calls: list[str]) -> None:
    query = sql.SQL("SELECT g, 1 / (g - 40000), 'x' FROM generate_series(1, 50000) g")
    with pytest.raises(psycopg2.errors.DivisionByZero, match="division by zero"):
        _rows(pg_dsn, query, socket=True)
    assert socket_calls
    with pytest.raises(TableVanishedError, match='relation "no_such_table" does not exist'):
        _rows(pg_dsn, sql.SQL("SELECT * FROM no_such_table"), socket=True)


def test_connection_is_left_in_its_transaction(pg_dsn: str, low_water: list[int]) -> None:
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SET LOCAL application_name = 'inside the transaction'")
            assert copy_socket.plain_socket(cur)
            got: list[RowSpans] = []
            copy_socket.copy_out(conn, "COPY (SELECT g, g::text FROM generate_series(1, 1000) g)"
                                 " TO STDOUT (FORMAT binary)", got.append, threading.Event(),
                                 batch_bytes=1 << 16, label="test")
            assert sum(len(g) for g in got) == 1000
            # a small reply (14 kB) wakes the reader on its first bytes: no mark raised
            assert low_water == [1]
            # the low-water mark that batches the reads is off again: libpq waits for bytes
            probe = socket.socket(fileno=os.dup(conn.fileno()))
            try:
                assert probe.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
            finally:
                probe.close()
            cur.execute("SHOW application_name")  # libpq goes on as if nothing happened
            assert cur.fetchone() == ("inside the transaction",)
        conn.rollback()
        with conn.cursor() as cur:
            cur.execute("SHOW application_name")
            assert cur.fetchone() != ("inside the transaction",)
    finally:
        conn.close()


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster of this module's, accepting SSL (self-signed certificate) on TCP and plain
    connections on its Unix socket."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed (scripts/setup.sh installs it)"
    root = tmp_path_factory.mktemp("ssl-cluster")
    certs = root / "certs"
    certs.mkdir()
    subprocess.run([openssl, "req", "-new", "-x509", "-days", "2", "-nodes", "-subj",
                    "/CN=localhost", "-newkey", "rsa:2048", "-keyout", str(certs / "key.pem"),
                    "-out", str(certs / "cert.pem")], check=True, capture_output=True)
    (certs / "key.pem").chmod(0o600)
    cluster = LocalCluster(root / "pg", overrides={
        "ssl": "on", "ssl_cert_file": f"'{certs / 'cert.pem'}'",
        "ssl_key_file": f"'{certs / 'key.pem'}'"})
    _give_to_postgres(certs)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ssl_dsn(own_cluster: LocalCluster) -> str:
    return own_cluster.dsn + " sslmode=require"


def _give_to_postgres(certs: Path) -> None:
    """As root the server runs as ``postgres``: it must own its key."""
    if os.geteuid() == 0:
        for path in (certs, *certs.iterdir()):
            shutil.chown(path, "postgres", "postgres")
        for parent in certs.resolve().parents:
            parent.chmod(parent.stat().st_mode | 0o011)


def test_ssl_connection_is_read_through_libpq(ssl_dsn: str, socket_calls: list[str]) -> None:
    with psycopg2.connect(ssl_dsn) as conn, conn.cursor() as cur:
        assert conn.info.ssl_in_use
        assert not copy_socket.plain_socket(cur)
    query = sql.SQL("SELECT g, g::text, decode({}, 'hex') FROM generate_series(1, 5000) g"
                    ).format(sql.SQL(DECOY_HEX))
    rows = _rows(ssl_dsn, query, socket=True)
    assert socket_calls == []  # encrypted: never the raw socket
    assert len(rows) == 5000
    assert rows[41][:2] == b"\x00\x03" and b"42" in rows[41]


def test_unix_socket_connection_is_read_from_the_socket(own_cluster: LocalCluster,
                                                       socket_calls: list[str]) -> None:
    dsn = f"host={own_cluster.root} port={own_cluster.port} user=postgres dbname=postgres"
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        assert conn.info.host == str(own_cluster.root) and copy_socket.plain_socket(cur)
    query = sql.SQL("SELECT g, repeat('u', g % 300), decode({}, 'hex') "
                    "FROM generate_series(1, 20000) g").format(sql.SQL(DECOY_HEX))
    rows = _rows(dsn, query, socket=True)
    assert len(socket_calls) == 1
    assert rows == _rows(dsn, query, socket=False) and len(rows) == 20000


def test_shared_connection_asks_its_encryption_once(pg_dsn: str,
                                                    socket_calls: list[str]) -> None:
    """Chunks of small tables read one after the other on one connection: whether its socket
    is in the clear is asked once (a round trip per table before)."""
    from psycopg2.extras import LoggingConnection

    class Log:
        def __init__(self) -> None:
            self.queries: list[str] = []

        def write(self, text: str) -> None:
            self.queries.append(text)

    log = Log()
    conn = psycopg2.connect(pg_dsn, connection_factory=LoggingConnection)
    conn.initialize(log)
    try:
        for n in (3, 5):
            query = sql.SQL("SELECT g, 'x' || g FROM generate_series(1, {}) g").format(
                sql.Literal(n))
            rows = [r for spans in binary_read.read_binary_rows(pg_dsn, None, query,
                                                                within=conn)
                    for r in spans.rows()]
            assert len(rows) == n
        assert len(socket_calls) == 2  # both read from the socket
        assert sum("pg_stat_gssapi" in q for q in log.queries) == 1, log.queries
    finally:
        conn.close()
