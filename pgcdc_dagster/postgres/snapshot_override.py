"""``snapshot.select.statement.overrides``: checking a user's SELECT before a snapshot reads
through it."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.postgres.snapshot_read import set_timeout, timed_out
from pgcdc_dagster.postgres.sql_filter import RejectedSql, check_select, single_statement

# --- overrides ---------------------------------------------------------------------------

def validate_override(conn: psycopg2.extensions.connection, schema: str, table: str,
                      select: str, columns: Sequence[tuple[str, int]], *,
                      timeout_ms: int = 0) -> str:
    """Check a ``snapshot.select.statement.overrides`` SELECT; return it, ready to embed.

    An override is a whole query by design (Debezium's), written by whoever configures the
    capture. PostgreSQL's parser (``postgres.sql_filter.check_select``) must see one SELECT
    that neither writes nor locks, calls only allow-listed built-in functions and operators
    (as filters may) and casts only to allow-listed types; no function or operator named
    like one it calls unqualified may exist outside ``pg_catalog`` (it could be chosen
    instead of the built-in). PostgreSQL must then accept it as a cursor query in a READ ONLY
    transaction with ``timeout_ms`` as ``statement_timeout``, returning every captured
    column with the table's type. ``columns`` are (name, type oid) pairs.

    Raises:
        ConfigurationError: naming the property and what is wrong.
    """
    prop = f"snapshot.select.statement.overrides.{schema}.{table}"
    try:
        body = single_statement(select)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"{prop} must be a single SELECT statement, but {exc}: {select!r}") from None
    functions, operators = check_select(body, prop)
    old_autocommit = conn.autocommit
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            set_timeout(cur, timeout_ms)
            cur.execute(
                """SELECT format('function %%I.%%I', n.nspname, p.proname) FROM pg_proc p
                   JOIN pg_namespace n ON n.oid = p.pronamespace
                   WHERE p.proname = ANY(%s) AND n.nspname <> 'pg_catalog'
                   UNION ALL
                   SELECT format('operator %%I.%%s', n.nspname, o.oprname) FROM pg_operator o
                   JOIN pg_namespace n ON n.oid = o.oprnamespace
                   WHERE o.oprname = ANY(%s) AND n.nspname <> 'pg_catalog' ORDER BY 1""",
                (sorted(functions), sorted(operators)))
            shadows = [str(r[0]) for r in cur.fetchall()]
            if shadows:
                raise RejectedSql(
                    f"{prop}: {', '.join(dict.fromkeys(shadows))} share a name with a "
                    "built-in the override uses unqualified, so PostgreSQL could call them "
                    "instead; write the built-in schema-qualified (pg_catalog.lower(x), "
                    "a OPERATOR(pg_catalog.=) b) or drop them")
            try:
                cur.execute(sql.SQL("DECLARE _pgcdc_override_check NO SCROLL CURSOR FOR {}")
                            .format(sql.SQL(body)))
                cur.execute(sql.SQL("SELECT * FROM ({}) AS _pgcdc_override LIMIT 0")
                            .format(sql.SQL(body)))
            except psycopg2.errors.QueryCanceled as exc:
                raise timed_out(exc, prop, timeout_ms) from None
            except psycopg2.Error as exc:
                message = (exc.pgerror or str(exc)).strip().splitlines()[0]
                raise ConfigurationError(
                    f"{prop} must be a single read-only SELECT statement; PostgreSQL rejected "
                    f"it: {message}") from None
            described = {d.name: d.type_code for d in cur.description or ()}
    finally:
        conn.rollback()
        conn.autocommit = old_autocommit
    missing = [name for name, _ in columns if name not in described]
    if missing:
        raise ConfigurationError(
            f"{prop} must return every captured column of {schema}.{table}; missing: "
            f"{', '.join(missing)}")
    wrong = [name for name, oid in columns if described[name] != oid]
    if wrong:
        raise ConfigurationError(
            f"{prop} returns columns with other types than the table's: {', '.join(wrong)} "
            "(the snapshot converts them with the table's column types; cast them back)")
    return body
