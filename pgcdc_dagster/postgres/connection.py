"""Opening source connections with errors that name the problem and never leak secrets."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from pgcdc_dagster.exceptions import ConfigurationError, SourceUnavailableError

_SECRET_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URI_SECRET_RE = re.compile(r"(://[^:/@]+:)([^@]+)(@)")


def redact(text: str) -> str:
    """Remove passwords from a DSN or from an error message that may quote one."""
    return _URI_SECRET_RE.sub(r"\1***\3", _SECRET_RE.sub(r"\1***", text))


def describe_dsn(dsn: str) -> str:
    """A loggable description of a DSN: host, port, database and user, never the password."""
    try:
        params = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        return "<unparseable DSN>"
    keys = ("host", "port", "dbname", "user")
    return " ".join(f"{k}={params[k]}" for k in keys if k in params)


def connect(dsn: str, *, autocommit: bool = True, application_name: str = "pgcdc_dagster",
            replication: bool = False) -> psycopg2.extensions.connection:
    """Open a connection; raise SourceUnavailableError with a redacted, actionable message."""
    try:
        kwargs: dict[str, object] = {"application_name": application_name}
        if replication:
            kwargs["connection_factory"] = psycopg2.extras.LogicalReplicationConnection
        conn = psycopg2.connect(dsn, **kwargs)
    except psycopg2.ProgrammingError as exc:
        raise ConfigurationError(
            f"PGCDC_PG_DSN is not a valid libpq connection string: {redact(str(exc)).strip()}"
        ) from None
    except psycopg2.OperationalError as exc:
        raise SourceUnavailableError(
            f"cannot connect to the source PostgreSQL ({describe_dsn(dsn)}): "
            f"{redact(str(exc)).strip()}. Check PGCDC_PG_DSN and that the server is running "
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
