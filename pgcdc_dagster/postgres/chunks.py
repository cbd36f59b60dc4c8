"""Incremental-snapshot chunk queries and watermarks (DBLog; design.md §3 decision 6).

Chunks are read in key order with a row-value comparison (``(k1, k2) > (v1, v2)``, the form
Debezium adopted in DBZ-5071) up to the key that was greatest when the table's snapshot
started, ``ORDER BY`` the key, ``LIMIT`` the chunk size. A ``surrogate-key`` orders the
chunks by that column first, then by the primary key, so the order is total even when the
surrogate column repeats values.

NULL-aware: the order is ``ORDER BY k1 ASC NULLS LAST, k2 ASC NULLS LAST, …`` (a NULL sorts
after every value, and NULLs compare equal to each other, as in PostgreSQL's own sort). A row
comparison is NULL as soon as a NULL is involved, so when an ordering column is nullable
(a nullable ``surrogate-key``, or a ``message.key.columns`` key on nullable columns) the
bounds are written out lexicographically with the same NULL placement::

    key > (v1, v2)  ≡  gt(k1, v1) OR (k1 ≐ v1 AND gt(k2, v2))
    gt(k, v)        ≡  k > v OR k IS NULL      (v not NULL);  FALSE  (v NULL)
    k ≐ v           ≡  k = v                   (v not NULL);  k IS NULL  (v NULL)

and ``key <= upto`` is its negation. Every row therefore falls in exactly one chunk, rows with
NULL key columns included (they come last, the all-NULL key at the very end). The lower bound
is read as its disjoint index ranges, merged in key order (:func:`chunk_select`). Tables whose
ordering columns are all NOT NULL keep the plain row comparison.
Watermarks are transactional logical decoding messages
(``pg_logical_emit_message(true, 'pgcdc.watermark', …)``), each in its own transaction: no
user table is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg2.errors
import psycopg2.extensions
import pyarrow as pa
from psycopg2 import sql

from pgcdc_dagster.cdc.changes import Row
from pgcdc_dagster.cdc.dblog import WATERMARK_PREFIX, Watermark
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.postgres.arrow_reader import read_batches, text_select
from pgcdc_dagster.postgres.snapshot_read import KeyColumn, set_timeout, timed_out


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """What to read from one table, and in which order."""

    schema: str
    table: str
    columns: tuple[str, ...]
    """Captured columns, in the captured relation's order."""
    order: tuple[KeyColumn, ...]
    """Ordering key: the surrogate key (if any) then the primary key columns."""
    condition: str | None = None
    """The canonical text of a checked ``additional-conditions`` filter (see
    ``postgres.signals``; never a user's text)."""
    nullable: frozenset[str] = frozenset()
    """Ordering columns that may hold NULL (``attnotnull`` false)."""
    timeout_ms: int = 0
    """``statement_timeout`` of the chunk queries (0: none)."""


def order_columns(conn: psycopg2.extensions.connection, schema: str, table: str,
                  key: Sequence[str], surrogate: str | None = None) -> tuple[KeyColumn, ...]:
    """The ordering key with each column's ``format_type``; checks a surrogate key."""
    return ordering(conn, schema, table, key, surrogate)[0]


def ordering(conn: psycopg2.extensions.connection, schema: str, table: str,
             key: Sequence[str], surrogate: str | None = None
             ) -> tuple[tuple[KeyColumn, ...], frozenset[str]]:
    """The ordering key (surrogate first, then ``key``) with each column's ``format_type``,
    and the ordering columns that may hold NULL (chunks then use NULL-aware bounds).

    Raises:
        ConfigurationError: the surrogate key or a key column is not a column of the table.
    """
    names = ([surrogate] if surrogate and surrogate not in key else []) + list(key)
    with conn.cursor() as cur:
        cur.execute(
            """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
               FROM pg_attribute a
               WHERE a.attrelid = format('%%I.%%I', %s::text, %s::text)::regclass
                 AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY(%s)""",
            (schema, table, names))
        found = {name: (typ, notnull) for name, typ, notnull in cur.fetchall()}
    missing = [n for n in names if n not in found]
    if missing:
        raise ConfigurationError(
            f"surrogate-key {surrogate!r}: no such column in {schema}.{table}"
            if surrogate in missing else f"{schema}.{table}: key columns {missing} missing")
    return (tuple(KeyColumn(n, found[n][0]) for n in names),
            frozenset(n for n in names if not found[n][1]))


def _names(spec: ChunkSpec) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(k.name) for k in spec.order)


def _row(values: Sequence[str | None], spec: ChunkSpec) -> sql.Composable:
    return sql.SQL("ROW({})").format(sql.SQL(", ").join(
        sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(k.sql_type))
        for v, k in zip(values, spec.order, strict=True)))


def _typed(value: str | None, column: KeyColumn) -> sql.Composable:
    return sql.SQL("{}::{}").format(sql.Literal(value), sql.SQL(column.sql_type))


def _after_terms(spec: ChunkSpec, values: Sequence[str | None]) -> list[list[sql.Composable]]:
    """``key > values`` in ``ASC NULLS LAST`` order as disjoint conjunctions, nearest rows
    first: for the last column with a value ``k_i > v_i`` then ``k_i IS NULL`` (nullable
    columns only), each under equality of the columns before it, then the same for the
    column before, and so on. Each conjunction is an index range (equalities, then one
    range or IS NULL condition), and concatenated they are exactly the rows after
    ``values`` in key order."""
    terms: list[list[sql.Composable]] = []
    equal: list[sql.Composable] = []
    for v, k in zip(values, spec.order, strict=True):
        col = sql.Identifier(k.name)
        if v is not None:
            terms.insert(0, [*equal, sql.SQL("{} > {}").format(col, _typed(v, k))])
            if k.name in spec.nullable:
                terms.insert(1, [*equal, sql.SQL("{} IS NULL").format(col)])
            equal.append(sql.SQL("{} = {}").format(col, _typed(v, k)))
        else:  # nothing sorts after NULL in this column: equal on it, go on to the next
            equal.append(sql.SQL("{} IS NULL").format(col))
    return terms


def _after(spec: ChunkSpec, values: Sequence[str | None]) -> sql.Composable:
    """``key > values`` as one predicate (see :func:`_after_terms`); never NULL."""
    terms = _after_terms(spec, values)
    if not terms:
        return sql.SQL("FALSE")
    return sql.SQL("({})").format(sql.SQL(" OR ").join(
        sql.SQL("({})").format(sql.SQL(" AND ").join(t)) for t in terms))


def chunk_select(spec: ChunkSpec, after: Sequence[str | None] | None,
                 upto: Sequence[str | None] | None, limit: int) -> sql.Composed:
    """``SELECT <columns>, <order key> FROM t WHERE key > after AND key <= upto AND (cond)
    ORDER BY key LIMIT n`` (NULLs last, NULL-aware bounds when a key column is nullable).

    With a nullable ordering column the lower bound is a disjunction; a single ``OR``
    predicate would make PostgreSQL walk the index from the table's start on every chunk
    (quadratic), so each disjoint range of :func:`_after_terms` is its own ordered, limited
    branch of a ``UNION ALL`` merged in key order (Merge Append of index range scans).
    """
    conds: list[sql.Composable] = []
    names = sql.SQL("({})").format(_names(spec)) if len(spec.order) > 1 else \
        sql.Identifier(spec.order[0].name)
    null_aware = any(k.name in spec.nullable for k in spec.order)

    def value(v: Sequence[str | None]) -> sql.Composable:
        return _row(v, spec) if len(spec.order) > 1 else _typed(v[0], spec.order[0])

    branches: list[list[sql.Composable]] = [[]]
    if after is not None:
        if null_aware:
            branches = _after_terms(spec, after) or [[sql.SQL("FALSE")]]
        else:
            conds.append(sql.SQL("{} > {}").format(names, value(after)))
    if upto is not None:
        conds.append(sql.SQL("NOT {}").format(_after(spec, upto)) if null_aware else
                     sql.SQL("{} <= {}").format(names, value(upto)))
    if spec.condition:
        conds.append(sql.SQL("({})").format(sql.SQL(spec.condition)))
    cols = sql.SQL(", ").join([
        *(sql.Identifier(c) for c in spec.columns),
        *(sql.SQL("{} AS {}").format(sql.Identifier(k.name), sql.Identifier(f"__order_{i}"))
          for i, k in enumerate(spec.order))])
    order = sql.SQL(", ").join(sql.SQL("{} ASC NULLS LAST").format(sql.Identifier(k.name))
                               for k in spec.order)
    selects = []
    for branch in branches:
        query = sql.SQL("SELECT {} FROM {}").format(cols,
                                                    sql.Identifier(spec.schema, spec.table))
        where = [*branch, *conds]
        if where:
            query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(where))
        selects.append(sql.SQL("{} ORDER BY {} LIMIT {}").format(query, order,
                                                                  sql.Literal(limit)))
    if len(selects) == 1:
        return selects[0]
    merged = sql.SQL(", ").join(sql.SQL("{} ASC NULLS LAST").format(
        sql.Identifier(f"__order_{i}")) for i in range(len(spec.order)))
    return sql.SQL("SELECT * FROM ({}) AS chunk ORDER BY {} LIMIT {}").format(
        sql.SQL(" UNION ALL ").join(sql.SQL("({})").format(q) for q in selects), merged,
        sql.Literal(limit))


def max_key(conn: psycopg2.extensions.connection, spec: ChunkSpec) -> list[str | None] | None:
    """The greatest ordering key now (the snapshot's end; later inserts arrive streamed)."""
    desc = sql.SQL(", ").join(sql.SQL("{} DESC NULLS FIRST").format(sql.Identifier(k.name))
                              for k in spec.order)
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.SQL("{}::text AS {}").format(sql.Identifier(k.name),
                                                          sql.Identifier(f"_pgcdc_k{i}"))
                           for i, k in enumerate(spec.order)),
        sql.Identifier(spec.schema, spec.table))
    if spec.condition:
        query = sql.SQL("{} WHERE ({})").format(query, sql.SQL(spec.condition))
    query = sql.SQL("{} ORDER BY {} LIMIT 1").format(query, desc)
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION READ ONLY")
            set_timeout(cur, spec.timeout_ms)
            try:
                cur.execute(query)
            except psycopg2.errors.QueryCanceled as exc:
                raise timed_out(exc, f"incremental snapshot of {spec.schema}.{spec.table}",
                                spec.timeout_ms) from None
            row = cur.fetchone()
    finally:
        conn.rollback()
        conn.autocommit = True
    return None if row is None else list(row)


def read_chunk(dsn: str, spec: ChunkSpec, after: Sequence[str | None] | None,
               upto: Sequence[str | None] | None, limit: int
               ) -> tuple[list[Row], list[str | None] | None]:
    """Read one chunk (a READ ONLY transaction of its own with ``spec.timeout_ms`` as
    ``statement_timeout``; through the Arrow reader, every value as its text output).

    Returns the rows (text bytes in ``spec.columns`` order) and the ordering key of the
    last row (None for an empty chunk).
    """
    names = [*spec.columns, *(f"__order_{i}" for i in range(len(spec.order)))]
    rows: list[Row] = []
    last: list[str | None] | None = None
    width = len(spec.columns)
    query = text_select(chunk_select(spec, after, upto, limit), names)
    for batch in read_batches(dsn, None, query,
                              label=f"incremental snapshot of {spec.schema}.{spec.table}",
                              statement_timeout_ms=spec.timeout_ms):
        if not batch.num_rows:
            continue
        # Column-wise: string -> binary is zero-copy and to_pylist yields the bytes (None for
        # NULL) directly; zip builds the row tuples in C.
        cols = [batch.column(i).cast(pa.binary()).to_pylist() for i in range(width)]
        rows.extend(zip(*cols, strict=True))
        last = [batch.column(width + j)[batch.num_rows - 1].as_py()
                for j in range(len(spec.order))]
    return rows, last


def emit_watermark(conn: psycopg2.extensions.connection, mark: Watermark) -> int:
    """Write a watermark message in its own transaction; return its LSN."""
    assert conn.autocommit, "watermarks need their own transaction"
    with conn.cursor() as cur:
        cur.execute("SELECT (pg_logical_emit_message(true, %s, %s) - '0/0'::pg_lsn)::bigint",
                    (WATERMARK_PREFIX, mark.encode()))
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


def estimated_rows(conn: psycopg2.extensions.connection, schema: str, table: str) -> int:
    """``pg_class.reltuples`` (0 when never analysed)."""
    with conn.cursor() as cur:
        cur.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class "
                    "WHERE oid = format('%%I.%%I', %s::text, %s::text)::regclass",
                    (schema, table))
        row = cur.fetchone()
    return int(row[0]) if row else 0
