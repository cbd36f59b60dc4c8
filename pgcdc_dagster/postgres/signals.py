"""Signals from the source: the Debezium signalling table, and ``additional-conditions`` checks.

The signalling table (``signal.data.collection``) has Debezium's layout: ``id``, ``type``,
``data`` (INC-19). The Dagster sensor polls it (one run per row, run key = signal id), so
unlike Debezium the table need not be in the publication.

``additional-conditions`` filters are SQL fragments embedded in the chunk SELECT; they must
only filter. :func:`validate_condition` checks one before any chunk is read, in two layers:

1. PostgreSQL's own parser (``postgres.sql_filter``, libpg_query): the filter must be one
   expression of the documented grammar (columns of the table, constants, allow-listed
   operators, functions and casts, boolean logic, IN / BETWEEN / LIKE / IS …); what runs is
   the canonical text written from the accepted tree, every function, operator and type
   qualified with ``pg_catalog``, never the user's text.
2. The server: ``EXPLAIN SELECT 1 FROM t WHERE (<canonical>)`` in a READ ONLY transaction
   with a ``statement_timeout`` must succeed (the filter is a boolean over the table).

Chunks are then read in READ ONLY transactions with the same ``statement_timeout``.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from pgcdc_dagster.capture.settings import DEFAULT_STATEMENT_TIMEOUT_MS
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.names import parse_table_id
from pgcdc_dagster.postgres.snapshot_read import set_timeout
from pgcdc_dagster.postgres.sql_filter import RejectedSql, canonical_filter

RejectedCondition = RejectedSql
"""An ``additional-conditions`` filter that could do more than filter."""


def table_columns(conn: psycopg2.extensions.connection, schema: str,
                  table: str) -> list[str]:
    """Names of the table's columns (not dropped, no system columns)."""
    with conn.cursor() as cur:
        cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = "
                    "format('%%I.%%I', %s::text, %s::text)::regclass "
                    "AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (schema, table))
        return [str(r[0]) for r in cur.fetchall()]


def canonical_condition(conn: psycopg2.extensions.connection, schema: str, table: str,
                        condition: str) -> str:
    """Layer 1 only: the filter's canonical text (the table's columns read from the
    catalog). Also used on a stored filter before each chunk is read.

    Raises:
        RejectedCondition: naming what is refused and what is allowed.
    """
    label = f"additional-conditions for {schema}.{table}"
    return canonical_filter(condition, table_columns(conn, schema, table), (schema, table),
                            label)


def validate_condition(conn: psycopg2.extensions.connection, schema: str, table: str,
                       condition: str, *,
                       timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS) -> str:
    """Check an ``additional-conditions`` filter for ``schema.table``; its canonical text.

    Raises:
        RejectedCondition: naming what is wrong.
    """
    label = f"additional-conditions for {schema}.{table}"
    canonical = canonical_condition(conn, schema, table, condition)
    old = conn.autocommit
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION READ ONLY")
            set_timeout(cur, timeout_ms)
            try:
                cur.execute(sql.SQL("EXPLAIN SELECT 1 FROM {} WHERE ({})").format(
                    sql.Identifier(schema, table), sql.SQL(canonical)))
            except psycopg2.Error as exc:
                message = (exc.pgerror or str(exc)).strip().splitlines()[0]
                raise RejectedCondition(
                    f"{label}: PostgreSQL rejected the filter as a WHERE clause of the table: "
                    f"{message}") from None
    finally:
        conn.rollback()
        conn.autocommit = old
    return canonical


@dataclass(frozen=True, slots=True)
class SignalRow:
    id: str
    type: str
    data: str | None


def parse_table_name(name: str) -> tuple[str, str]:
    """``schema.table`` (parts may be double-quoted: :func:`parse_table_id`) into its parts.

    Raises:
        ConfigurationError: not ``<schema>.<table>``, or ambiguous (unquoted dots).
    """
    try:
        return parse_table_id(name)
    except ValueError as exc:
        raise ConfigurationError(f"signal.data.collection: {exc}") from None


def read_signals(conn: psycopg2.extensions.connection, collection: str) -> list[SignalRow]:
    """Every row of the signalling table (its first three columns: id, type, data), oldest
    writing transaction first (``age(xmin)``; rows of one transaction in physical order), so
    a pause written after an execute-snapshot is applied after it."""
    schema, table = parse_table_name(collection)
    with conn.cursor() as cur:
        cur.execute(sql.SQL("SELECT * FROM {} ORDER BY age(xmin) DESC, ctid").format(
            sql.Identifier(schema, table)))
        rows = cur.fetchall()
    return [SignalRow(str(r[0]), str(r[1]), None if r[2] is None else str(r[2])) for r in rows]


def create_signal_table(conn: psycopg2.extensions.connection, collection: str) -> None:
    """Create the signalling table with Debezium's documented layout, if missing."""
    schema, table = parse_table_name(collection)
    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id varchar(42) PRIMARY KEY, "
                            "type varchar(32) NOT NULL, data varchar(2048) NULL)").format(
            sql.Identifier(schema, table)))
