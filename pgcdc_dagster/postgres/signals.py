"""Signals from the source: the Debezium signalling table, and ``additional-conditions`` checks.

The signalling table (``signal.data.collection``) has Debezium's layout: ``id``, ``type``,
``data`` (INC-19). The Dagster sensor polls it (one run per row, run key = signal id), so
unlike Debezium the table need not be in the publication.

``additional-conditions`` filters are SQL fragments embedded in the chunk SELECT; they must
only filter. :func:`validate_condition` refuses, before any chunk is read:

* anything but one expression: ``;``, comments, and statement keywords (SELECT, INSERT, …,
  so no sub-queries either) outside string literals;
* calls to VOLATILE functions (``pg_proc.provolatile = 'v'``: ``pg_terminate_backend``,
  ``set_config``, ``pg_logical_emit_message``, ``nextval``, ``random``, …), matched by name
  over every overload, conservatively;
* anything PostgreSQL does not accept as a boolean ``WHERE`` clause of the table
  (``EXPLAIN SELECT 1 FROM t WHERE (<cond>)`` in a READ ONLY transaction).

Chunks are then read in READ ONLY transactions, so a write would fail even if one slipped
through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from pgcdc_dagster.exceptions import ConfigurationError

FORBIDDEN_KEYWORDS = frozenset("""
select insert update delete merge with into from_ table create drop alter grant revoke
truncate copy call do execute perform set reset lock notify listen unlisten vacuum analyze
cluster reindex refresh discard prepare deallocate begin commit rollback savepoint release
declare fetch move close checkpoint load import comment security union intersect except
returning values
""".split())

_TOKEN = re.compile(r"""
    (?P<string>[eE]?'(?:[^'\\]|''|\\.)*')
  | (?P<dollar>\$[A-Za-z_]*\$)
  | (?P<qident>"(?:[^"]|"")*")
  | (?P<comment>--|/\*)
  | (?P<semi>;)
  | (?P<ident>[A-Za-z_][A-Za-z_0-9$]*)
  | (?P<other>\S)
""", re.VERBOSE)


class RejectedCondition(ConfigurationError):
    """An ``additional-conditions`` filter that could do more than filter."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "other"
        out.append((kind, m.group(0)))
    return out


def check_expression(text: str, label: str) -> list[str]:
    """Lexical checks; return the names of the functions the expression calls."""
    toks = _tokens(text)
    if not text.strip():
        raise RejectedCondition(f"{label}: the filter is empty")
    functions: list[str] = []
    depth = 0
    for i, (kind, tok) in enumerate(toks):
        depth += {"(": 1, ")": -1}.get(tok, 0) if kind == "other" else 0
        if depth < 0:
            raise RejectedCondition(f"{label}: unbalanced parentheses: {text!r}")
        if kind == "semi":
            raise RejectedCondition(f"{label}: ';' is not allowed: a filter is one boolean "
                                    f"expression, not statements: {text!r}")
        if kind == "comment":
            raise RejectedCondition(f"{label}: comments are not allowed in a filter: {text!r}")
        if kind == "dollar":
            raise RejectedCondition(f"{label}: dollar quoting is not allowed in a filter")
        if kind == "ident" and tok.lower() in FORBIDDEN_KEYWORDS:
            raise RejectedCondition(
                f"{label}: {tok.upper()} is not allowed: a filter is one boolean expression "
                f"over the table's columns (no statements or sub-queries): {text!r}")
        if kind in ("ident", "qident") and i + 1 < len(toks) and toks[i + 1][1] == "(":
            functions.append(tok[1:-1].replace('""', '"') if kind == "qident"
                             else tok.lower())
    if depth:
        raise RejectedCondition(f"{label}: unbalanced parentheses: {text!r}")
    return functions


@dataclass(frozen=True, slots=True)
class SignalRow:
    id: str
    type: str
    data: str | None


def validate_condition(conn: psycopg2.extensions.connection, schema: str, table: str,
                       condition: str) -> str:
    """Check an ``additional-conditions`` filter for ``schema.table``; return it.

    Raises:
        RejectedCondition: naming what is wrong.
    """
    label = f"additional-conditions for {schema}.{table}"
    functions = check_expression(condition, label)
    old = conn.autocommit
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION READ ONLY")
            if functions:
                cur.execute("SELECT DISTINCT proname FROM pg_proc WHERE proname = ANY(%s) "
                            "AND provolatile = 'v'", (functions,))
                volatile = sorted(r[0] for r in cur.fetchall())
                if volatile:
                    raise RejectedCondition(
                        f"{label}: calls volatile function(s) {', '.join(volatile)}; a filter "
                        "may only use immutable or stable functions (no side effects)")
            try:
                cur.execute(sql.SQL("EXPLAIN SELECT 1 FROM {} WHERE ({})").format(
                    sql.Identifier(schema, table), sql.SQL(condition)))
            except psycopg2.Error as exc:
                message = (exc.pgerror or str(exc)).strip().splitlines()[0]
                raise RejectedCondition(
                    f"{label}: PostgreSQL rejected the filter as a WHERE clause of the table: "
                    f"{message}") from None
    finally:
        conn.rollback()
        conn.autocommit = old
    return condition


def parse_table_name(name: str) -> tuple[str, str]:
    """``schema.table`` (parts may be double-quoted) into its parts."""
    m = re.fullmatch(r'\s*("(?:[^"]|"")*"|[^."]+)\.("(?:[^"]|"")*"|[^."]+)\s*', name)
    if not m:
        raise ConfigurationError(f"signal.data.collection {name!r} must be <schema>.<table>")

    def part(p: str) -> str:
        return p[1:-1].replace('""', '"') if p.startswith('"') else p

    return part(m.group(1)), part(m.group(2))


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
