"""The source PostgreSQL as a Dagster resource."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
import psycopg2.extensions
from pydantic import Field

from pgcdc_dagster.postgres.connection import connection, describe_dsn


class PostgresResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Connection to the source database (``PGCDC_PG_DSN``)."""

    dsn: str = Field(
        description="libpq connection string of the source database, e.g. "
        "'host=db port=5432 dbname=app user=cdc password=...' (Debezium database.hostname, "
        "database.port, database.dbname, database.user, database.password). Supply it with "
        "dg.EnvVar('PGCDC_PG_DSN'); it is never logged.",
    )

    @contextmanager
    def get_connection(self) -> Iterator[psycopg2.extensions.connection]:
        """An autocommit connection, closed on exit."""
        with connection(self.dsn) as conn:
            yield conn

    def describe(self) -> str:
        """Host, port, database and user: safe to log."""
        return describe_dsn(self.dsn)
