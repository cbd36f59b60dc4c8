"""Reaching the source: connect_timeout, no secret in any message, privilege errors that name
the fix."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator

import psycopg2
import pytest
from psycopg2 import sql

from pgcdc_dagster.capture.incremental import run_incremental
from pgcdc_dagster.capture.runner import run_bronze
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.exceptions import ConfigurationError, SourceUnavailableError
from pgcdc_dagster.postgres.connection import DEFAULT_CONNECT_TIMEOUT_S, connect
from pgcdc_dagster.postgres.discovery import resolve_capture
from pgcdc_dagster.postgres.dsn import scrub

pytestmark = pytest.mark.integration

PASSWORD = "Zq9 'x7=Kw/@:"
"""Spaces, a quote, '=', and URI delimiters: every way a password can break a DSN."""


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def _no_secret(message: str, password: str = PASSWORD) -> None:
    for piece in ("Zq9", "x7", "Kw", password):
        assert piece not in message, message


def _connect_in_thread(dsn: str) -> BaseException:
    """connect(dsn) in a thread, so that a missing timeout fails the test, not hangs it."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            connect(dsn).close()
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=DEFAULT_CONNECT_TIMEOUT_S * 6)
    assert not thread.is_alive(), "connect() hung: no connect_timeout"
    assert outcome, "connect() to a silent port succeeded"
    return outcome[0]


def test_a_silent_host_fails_within_connect_timeout(silent_port, monkeypatch) -> None:
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    quoted = PASSWORD.replace("\\", "\\\\").replace("'", "\\'")
    err = _connect_in_thread(f"host=127.0.0.1 port={silent_port} dbname=app user=cdc "
                             f"password='{quoted}'")  # the default: 10 s
    assert isinstance(err, SourceUnavailableError)
    message = str(err)
    assert "host=127.0.0.1" in message and f"port={silent_port}" in message
    assert f"connect_timeout = {DEFAULT_CONNECT_TIMEOUT_S} s" in message
    _no_secret(message)
    # the DSN's own value wins (a URI with the password percent-encoded)
    encoded = "Zq9%20%27x7%3DKw%2F%40%3A"
    err = _connect_in_thread(f"postgresql://cdc:{encoded}@127.0.0.1:{silent_port}/app"
                             "?connect_timeout=2")
    assert "connect_timeout = 2 s" in str(err)
    _no_secret(str(err))
    assert encoded not in str(err)


def test_connect_timeout_is_applied_to_every_connection(pg_dsn) -> None:
    for replication in (False, True):
        conn = connect(pg_dsn, replication=replication)
        try:
            assert conn.info.dsn_parameters["connect_timeout"] == str(DEFAULT_CONNECT_TIMEOUT_S)
        finally:
            conn.close()
    conn = connect(pg_dsn + " connect_timeout=3")
    assert conn.info.dsn_parameters["connect_timeout"] == "3"
    conn.close()


@pytest.mark.parametrize("dsn", [
    "host=127.0.0.1 dbname=app user=cdc password=Zq9 x7Kw",  # unquoted space
    "host=127.0.0.1 dbname=app password='Zq9 x7Kw",  # unterminated quote
    "host=127.0.0.1 password=Zq9=x7 Kw=1",  # '=' then a word libpq takes for a keyword
    "postgresql://cdc:Zq9%zzx7Kw@127.0.0.1/app",  # bad percent-encoding
])
def test_a_dsn_that_does_not_parse_is_not_echoed(dsn) -> None:
    with pytest.raises(ConfigurationError) as err:
        connect(dsn)
    assert "PGCDC_PG_DSN is not a valid libpq connection string" in str(err.value)
    _no_secret(str(err.value))


@pytest.mark.parametrize("dsn", [
    "postgresql://cdc:Zq9x7/Kw@127.0.0.1/app",  # '/' ends the authority: password -> port
    "postgresql://cdc:Zq9@x7Kw@127.0.0.1:1/app",  # '@': the rest taken for the host
    "postgresql://cdc:Zq9x7Kw@127.0.0.1:badport/app",
])
def test_a_malformed_uri_leaks_no_part_of_the_password(dsn) -> None:
    with pytest.raises(SourceUnavailableError) as err:
        connect(dsn)
    _no_secret(str(err.value))


def test_scrub_removes_every_reading_of_the_password() -> None:
    dsn = "host=h password='Zq9 x7Kw' user=u"
    assert scrub('missing "=" after "x7Kw" in connection info string', dsn) == \
        'missing "=" after "***" in connection info string'
    assert scrub("FATAL: user u, password Zq9 x7Kw", dsn) == "FATAL: user u, password ***"
    assert scrub('could not translate host name "db" to address', dsn) == \
        'could not translate host name "db" to address'


@pytest.fixture
def role(pg_conn) -> Iterator[str]:
    """A login role without REPLICATION, ownership or privileges (dropped afterwards)."""
    name = f"cdc_{uuid.uuid4().hex[:8]}"
    with pg_conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with pg_conn.cursor() as cur:
            cur.execute(sql.SQL("DROP OWNED BY {}; DROP ROLE {}").format(
                sql.Identifier(name), sql.Identifier(name)))


def _as(pg_dsn: str, user: str) -> str:
    return " ".join([p for p in pg_dsn.split() if not p.startswith("user=")] + [f"user={user}"])


def _settings(dsn: str, lakehouse, **kwargs: object) -> CaptureSettings:
    return CaptureSettings(dsn=dsn, lakehouse=str(lakehouse), include=("public\\.orders",),
                           slot="access", publication="access", **kwargs)  # type: ignore[arg-type]


def test_privilege_errors_name_the_fix(pg_dsn, pg_conn, role, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE orders (id int PRIMARY KEY); CREATE TABLE secret (id int "
                    "PRIMARY KEY)")
        cur.execute(sql.SQL("GRANT SELECT ON orders TO {}").format(sql.Identifier(role)))
        cur.execute("SELECT current_database()")
        database_name = cur.fetchone()[0]
        database = sql.Identifier(database_name)
    dsn = _as(pg_dsn, role)

    # no SELECT: left out under a wildcard, refused with the GRANT when named
    with psycopg2.connect(dsn) as conn:
        found = resolve_capture(conn, ["public\\..*"])
        assert [r.name for r in found.relations] == ["orders"]
        assert "GRANT SELECT ON public.secret" in found.skipped[0].describe()
        with pytest.raises(ConfigurationError, match=r"GRANT SELECT ON public\.secret"):
            resolve_capture(conn, ["public.secret"])
    conn.close()

    # no REPLICATION: the replication connection and the slot say how to grant it
    with pytest.raises(ConfigurationError, match="ALTER ROLE <capture user> WITH REPLICATION"):
        connect(dsn, replication=True)

    # Up front, before anything is created at the source: every shortfall with its fix.
    secret_dsn = f"{dsn} password='{PASSWORD.replace(chr(39), chr(92) + chr(39))}'"

    def refused() -> str:
        with pytest.raises(ConfigurationError) as err:
            run_bronze(_settings(secret_dsn, lakehouse), spark,
                       force_snapshot_step=True)
        message = str(err.value)
        _no_secret(message)
        assert "nothing was changed at the source" in message
        with pg_conn.cursor() as cur:  # and indeed: no slot, no publication made
            cur.execute("SELECT (SELECT count(*) FROM pg_replication_slots WHERE database = "
                        "current_database()), (SELECT count(*) FROM pg_publication WHERE "
                        "pubname = 'access')")
            assert cur.fetchone() == (0, 0)
        return message

    message = refused()
    assert f"ALTER ROLE {role} WITH REPLICATION" in message and "rds_replication" in message
    assert f"GRANT CREATE ON DATABASE {database_name} TO {role}" in message
    assert f"ALTER TABLE public.orders OWNER TO {role}" in message
    assert "CREATE PUBLICATION access FOR TABLE public.orders" in message
    assert "publication.autocreate.mode = disabled" in message
    with pg_conn.cursor() as cur:
        cur.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            database, sql.Identifier(role)))
    message = refused()
    assert "GRANT CREATE" not in message and "(owner: " in message
    assert "REPLICATION" in message

    # The table is the role's now, but the publication is the DBA's and lacks it.
    with pg_conn.cursor() as cur:
        cur.execute(sql.SQL("ALTER TABLE orders OWNER TO {}").format(sql.Identifier(role)))
        cur.execute("CREATE PUBLICATION access FOR TABLE secret")
    with pytest.raises(ConfigurationError) as err:
        run_bronze(_settings(secret_dsn, lakehouse), spark, force_snapshot_step=True)
    assert "publication access belongs to" in str(err.value)
    assert f"OWNER TO {role}" in str(err.value) and "ALTER TABLE" not in str(err.value)
    _no_secret(str(err.value))

    # A DBA-made publication, capture told not to touch it: only REPLICATION is missing,
    # for the bronze runs and for the incremental snapshots alike.
    with pg_conn.cursor() as cur:
        cur.execute("ALTER PUBLICATION access SET TABLE orders")
    settings = _settings(secret_dsn, lakehouse, publication_autocreate="disabled")
    for attempt in (lambda: run_bronze(settings, spark, force_snapshot_step=True),
                    lambda: run_incremental(settings)):
        with pytest.raises(ConfigurationError) as err:
            attempt()
        assert "REPLICATION" in str(err.value) and "publication" not in str(err.value)
        _no_secret(str(err.value))
    with pg_conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_replication_slots WHERE database = "
                    "current_database()")
        assert cur.fetchone()[0] == 0

    # Granted: the same run captures.
    with pg_conn.cursor() as cur:
        cur.execute(sql.SQL("ALTER ROLE {} WITH REPLICATION").format(sql.Identifier(role)))
        cur.execute("INSERT INTO orders VALUES (1), (2)")
    run = run_bronze(settings, spark, force_snapshot_step=True)
    assert run.snapshot is not None and run.snapshot.rows == 2
