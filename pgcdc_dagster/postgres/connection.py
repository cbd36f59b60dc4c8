"""Opening source connections with errors that name the problem and never leak secrets."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from pgcdc_dagster.exceptions import ConfigurationError, SourceUnavailableError
from pgcdc_dagster.postgres.dsn import safe_value, scrub
from pgcdc_dagster.postgres.privileges import replication_fix

_SECRET_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URI_SECRET_RE = re.compile(r"(://[^:/@]+:)([^@]+)(@)")


def redact(text: str) -> str:
    """Remove passwords from a DSN or from an error message that may quote one."""
    return _URI_SECRET_RE.sub(r"\1***\3", _SECRET_RE.sub(r"\1***", text))


DEFAULT_CONNECT_TIMEOUT_S = 10
"""libpq ``connect_timeout`` when neither the DSN nor ``PGCONNECT_TIMEOUT`` sets one: a host
that accepts TCP and never answers fails after this many seconds instead of hanging."""

_PARSE_PROBLEMS = (
    ('missing "="', "a word without '=': a value holding a space must be single-quoted "
     "(password='a b')"),
    ("unterminated quoted string", "a quoted value without its closing quote (a quote inside "
     "a value is written \\')"),
    ("invalid connection option", "an unknown keyword"),
    ("percent-encoded", "a malformed URI: percent-encode special characters (%, @, /, :, "
     "space) in the user and password"),
    ("invalid URI", "a malformed URI: percent-encode special characters in the user and "
     "password"),
)


def describe_dsn(dsn: str) -> str:
    """A loggable description of a DSN: host, port, database and user, never the password
    (nor a value that may hold part of it, as a malformed URI puts it in host or port)."""
    try:
        params = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        return "<unparseable DSN>"
    keys = ("host", "port", "dbname", "user")
    return " ".join(f"{k}={safe_value(params[k], dsn)}" for k in keys if k in params)


def connect_options(dsn: str) -> dict[str, object]:
    """``connect_timeout`` to pass to libpq, unless the DSN or the environment sets it."""
    try:
        params = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        return {}
    if "connect_timeout" in params or os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    return {"connect_timeout": DEFAULT_CONNECT_TIMEOUT_S}


SESSION_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("idle_in_transaction_session_timeout", "0"),
    ("statement_timeout", "0"),
    ("lock_timeout", "0"),
)
"""Settings every session of the project starts with (libpq ``options``), whatever the
role's or database's defaults (``ALTER ROLE ... SET``): the exported snapshot's connection
and the chunk readers sit idle in their transactions while other chunks are read, and the
COPY reads, slot creation and peeks run as long as the data they carry. A per-statement
limit the project sets itself (``snapshot.statement.timeout.ms``) still applies (``SET
LOCAL``). Options the DSN (or ``PGOPTIONS``) gives come after these, so they win."""


def session_options(dsn: str) -> dict[str, object]:
    """``options`` to pass to libpq: :data:`SESSION_DEFAULTS`, then the DSN's own
    ``options`` (or ``PGOPTIONS`` when the DSN has none)."""
    try:
        given = psycopg2.extensions.parse_dsn(dsn).get("options")
    except psycopg2.ProgrammingError:
        given = None
    if given is None:
        given = os.environ.get("PGOPTIONS", "")
    ours = " ".join(f"-c {name}={value}" for name, value in SESSION_DEFAULTS)
    return {"options": f"{ours} {given}".strip()}


def _parse_problem(message: str) -> str:
    for marker, problem in _PARSE_PROBLEMS:
        if marker in message:
            return problem
    return "libpq cannot parse it"


def _timeout_in_effect(dsn: str) -> str:
    try:
        value = psycopg2.extensions.parse_dsn(dsn).get("connect_timeout")
    except psycopg2.ProgrammingError:
        value = None
    return str(value or os.environ.get("PGCONNECT_TIMEOUT") or DEFAULT_CONNECT_TIMEOUT_S)


def connect(dsn: str, *, autocommit: bool = True, application_name: str = "pgcdc_dagster",
            replication: bool = False) -> psycopg2.extensions.connection:
    """Open a connection (``connect_timeout`` by default, see :func:`connect_options`; the
    session settings of :data:`SESSION_DEFAULTS`).

    Raises:
        ConfigurationError: the DSN does not parse (the message never quotes it), or the
            user lacks what a replication connection needs (the fix is named).
        SourceUnavailableError: the server cannot be reached or refuses the connection; the
            message names host and port, never the password.
    """
    try:
        kwargs: dict[str, object] = {"application_name": application_name,
                                     **connect_options(dsn), **session_options(dsn)}
        if replication:
            kwargs["connection_factory"] = psycopg2.extras.LogicalReplicationConnection
        conn = psycopg2.connect(dsn, **kwargs)
    except psycopg2.ProgrammingError as exc:
        raise ConfigurationError(
            f"PGCDC_PG_DSN is not a valid libpq connection string ({_parse_problem(str(exc))}). "
            "Write key=value pairs (host=db port=5432 dbname=app user=cdc password='p w') or "
            "a URI (postgresql://cdc:p%20w@db:5432/app); the value is not shown here because "
            "it holds the password."
        ) from None
    except psycopg2.OperationalError as exc:
        message = scrub(redact(str(exc)), dsn).strip()
        fix = replication_fix(message) if replication else None
        if fix is not None:
            raise ConfigurationError(f"{message}. {fix}") from None
        if "timeout expired" in message:
            message += (f" (no answer within connect_timeout = {_timeout_in_effect(dsn)} s: "
                        "something accepts connections there but is not answering as "
                        "PostgreSQL, or the network drops packets; check the host and port, "
                        "or raise connect_timeout in PGCDC_PG_DSN)")
        raise SourceUnavailableError(
            f"cannot connect to the source PostgreSQL ({describe_dsn(dsn)}): "
            f"{message}. Check PGCDC_PG_DSN and that the server is running "
            "and accepts connections from this host."
        ) from None
    if not replication:
        conn.autocommit = autocommit
    return conn


@contextmanager
def connection(dsn: str, *, autocommit: bool = True) -> Iterator[psycopg2.extensions.connection]:
    """Context-managed :func:`connect` that always closes."""
    conn = connect(dsn, autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()
