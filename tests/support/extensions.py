"""Extensions the type tests need (PostGIS, hstore, ltree, citext).

``.ci/run`` installs them (Debian's postgresql-15-postgis-3; the others ship with
postgresql-15). A server given through ``PGCDC_TEST_DSN`` may lack one: the test is then
skipped, naming the extension, because the server cannot run it — never for a missing
feature of the project.
"""

from __future__ import annotations

import psycopg2
import pytest
from psycopg2 import sql


def require_extensions(conn, *names: str) -> None:
    """``CREATE EXTENSION IF NOT EXISTS`` each of ``names``, or skip the test."""
    for name in names:
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("CREATE EXTENSION IF NOT EXISTS {}").format(
                    sql.Identifier(name)))
        except psycopg2.Error as exc:
            pytest.skip(f"extension {name} is not installed on this PostgreSQL server "
                        f"({(exc.pgerror or str(exc)).strip()})")
