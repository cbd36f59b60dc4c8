"""Snapshot reads: chunk planning, chunk queries and COPY streams as Arrow text batches.

Chunks (design.md §3, decision 7; issue 5):

* **key ranges** for every table with a key (every captured table has one: a primary key or a
  replica identity index, both btree, NOT NULL and unique). Boundaries are equal-width
  ranges between min and max for a single integer key, otherwise quantiles of a
  ``TABLESAMPLE SYSTEM`` sample; composite keys use row-value comparison
  ``(a, b) >= (x, y) AND (a, b) < (z, w)``, which follows the key index. A key belongs to
  exactly one range whatever happens to its row, which is what lets an interrupted snapshot
  finish its remaining ranges at a later consistent point (see ``capture/snapshot.py``).
* **CTID block ranges** (``ctid >= '(a,0)' AND ctid < '(b,0)'``, a TID range scan) when no key
  can be used. An update may move a row to another block, so CTID chunks are only consistent
  when all of them are read in the same snapshot.

Reading: ``COPY (SELECT ...) TO STDOUT`` in PostgreSQL's text format runs in a thread that
writes into an OS pipe, and pyarrow's streaming CSV reader parses it (tab-separated, no
quoting, ``\\N`` for NULL; newlines inside values are escaped, so a row is one line and the
parser needs no quote tracking). Values escaped by COPY (backslash, control characters) are
unescaped after parsing, for the few values that hold a backslash. Memory stays bounded by
the parser's block size whatever the chunk's size. Every reader transaction pins the session
settings the converters expect (ISO dates, ``postgres`` intervals, UTC, shortest exact floats,
hex bytea), so the text equals what pgoutput would send under the same settings.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from psycopg2 import sql

from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.exceptions import ConfigurationError, PgCdcError
from pgcdc_dagster.postgres.connection import connect, connection
from pgcdc_dagster.postgres.sql_filter import RejectedSql, check_select, single_statement
from pgcdc_dagster.postgres.statements import execute

CSV_BLOCK_BYTES = 1 << 20
"""Default parser block: about ``snapshot.fetch.size`` rows of a typical table."""
MIN_BLOCK_BYTES = 128 << 10
MAX_BLOCK_BYTES = 1 << 20
"""pyarrow's streaming CSV reader reads up to 32 blocks ahead on its I/O thread, so a reader
holds up to 32x its block: 1 MiB blocks keep that near 32 MiB whatever ``snapshot.fetch.size``."""

SESSION_SETTINGS: tuple[tuple[str, str], ...] = (
    ("client_encoding", "UTF8"),
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("TimeZone", "UTC"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
)
"""``SET LOCAL`` in every snapshot transaction: the text forms the converters parse."""

SAMPLE_BLOCKS_PER_CHUNK = 50
SAMPLE_MAX_BLOCKS = 20_000
PARALLEL_MIN_CHUNK_BYTES = 8 << 20
"""A table is spread over the snapshot's task slots while each chunk keeps this much heap."""


class TableVanishedError(ConfigurationError):
    """A captured table (or one of its columns) disappeared after the snapshot was planned."""


class SnapshotExpiredError(PgCdcError):
    """The exported snapshot is gone (its replication connection closed)."""


@dataclass(frozen=True, slots=True)
class KeyColumn:
    """One key column, in key-index order, with the SQL type its boundary literals cast to."""

    name: str
    sql_type: str


@dataclass(frozen=True, slots=True)
class Chunk:
    """One unit of snapshot work: a key range or a CTID block range of one table.

    Key ranges are ``[lower, upper)`` over the key columns (text values cast to the key
    types); ``None`` is open. CTID ranges are ``[start_block, end_block)`` blocks.
    """

    schema: str
    table: str
    index: int
    kind: str = "key"
    """``key`` or ``ctid``."""
    lower: tuple[str, ...] | None = None
    upper: tuple[str, ...] | None = None
    start_block: int = 0
    end_block: int | None = None

    @property
    def qualified(self) -> tuple[str, str]:
        return (self.schema, self.table)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind,
                "lower": None if self.lower is None else list(self.lower),
                "upper": None if self.upper is None else list(self.upper),
                "start_block": self.start_block, "end_block": self.end_block}

    @classmethod
    def from_json(cls, schema: str, table: str, data: dict[str, Any]) -> Chunk:
        lower, upper = data.get("lower"), data.get("upper")
        return cls(schema, table, int(data["index"]), str(data["kind"]),
                   None if lower is None else tuple(lower),
                   None if upper is None else tuple(upper),
                   int(data.get("start_block") or 0),
                   None if data.get("end_block") is None else int(data["end_block"]))

    def __str__(self) -> str:
        if self.kind == "ctid":
            end = "" if self.end_block is None else str(self.end_block)
            span = f"blocks [{self.start_block}, {end})"
        else:
            lo = "-inf" if self.lower is None else ",".join(self.lower)
            hi = "+inf" if self.upper is None else ",".join(self.upper)
            span = f"keys [{lo}, {hi})"
        return f"{self.schema}.{self.table}#{self.index} {span}"


def set_timeout(cur: psycopg2.extensions.cursor, timeout_ms: int) -> None:
    """``SET LOCAL statement_timeout`` (0: none) in the current transaction."""
    cur.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))


def timed_out(exc: psycopg2.Error, label: str, timeout_ms: int) -> PgCdcError:
    """The error for a statement cancelled by ``statement_timeout``, naming the setting."""
    message = (exc.pgerror or str(exc)).strip().splitlines()[0]
    return PgCdcError(
        f"{label}: {message} (statement_timeout {timeout_ms} ms). A statement that runs an "
        "additional-conditions filter or a snapshot.select.statement.overrides SELECT is "
        "cancelled after PGCDC_INCREMENTAL_STATEMENT_TIMEOUT_MS; make the filter cheaper (a "
        "condition an index serves, a smaller incremental.snapshot.chunk.size) or raise the "
        "setting, then run again (chunks already committed are kept).")


def set_session(cur: psycopg2.extensions.cursor, *, local: bool = True) -> None:
    """Pin the text output settings the converters expect (``SET LOCAL`` by default)."""
    scope = "SET LOCAL" if local else "SET"
    for name, value in SESSION_SETTINGS:
        cur.execute(sql.SQL(scope + " {} = {}").format(sql.Identifier(name),
                                                       sql.Literal(value)))


# --- planning ----------------------------------------------------------------------------

def key_columns(conn: psycopg2.extensions.connection, schema: str,
                table: str) -> list[KeyColumn]:
    """The primary key (else the replica identity index) columns, in index order.

    Chunks are ranges of this key whatever key the events carry (``message.key.columns``):
    it is unique, NOT NULL and btree-ordered, so its ranges partition the rows.
    """
    with conn.cursor() as cur:
        cur.execute(
            """SELECT a.attname, format_type(a.atttypid, a.atttypmod), i.indisprimary
               FROM pg_index i
               JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
               WHERE i.indrelid = format('%%I.%%I', %s::text, %s::text)::regclass
                 AND (i.indisprimary OR i.indisreplident)
               ORDER BY i.indisprimary DESC, k.ord""",
            (schema, table),
        )
        rows = cur.fetchall()
    if not rows:
        return []
    primary = rows[0][2]
    return [KeyColumn(name, typ) for name, typ, is_primary in rows if is_primary == primary]


def key_columns_of(conn: psycopg2.extensions.connection, names: Sequence[tuple[str, str]]
                   ) -> dict[tuple[str, str], list[KeyColumn]]:
    """:func:`key_columns` of many tables in one query (a table not found is left out)."""
    if not names:
        return {}
    with conn.cursor() as cur:
        cur.execute(
            """SELECT n.s, n.t, a.attname, format_type(a.atttypid, a.atttypmod), i.indisprimary
               FROM unnest(%s::text[], %s::text[]) AS n(s, t)
               JOIN pg_class c ON c.oid = to_regclass(format('%%I.%%I', n.s, n.t))
               LEFT JOIN pg_index i ON i.indrelid = c.oid
                    AND (i.indisprimary OR i.indisreplident)
               LEFT JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
               LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
               ORDER BY n.s, n.t, i.indisprimary DESC, k.ord""",
            ([s for s, _ in names], [t for _, t in names]))
        rows = cur.fetchall()
    found: dict[tuple[str, str], list[tuple[str, str, bool]]] = {}
    for s, t, name, typ, primary in rows:
        cols = found.setdefault((s, t), [])
        if name is not None:
            cols.append((name, typ, primary))
    return {n: [KeyColumn(name, typ) for name, typ, primary in cols if primary == cols[0][2]]
            for n, cols in found.items()}


@dataclass(frozen=True, slots=True)
class TableSize:
    """Heap size and estimated rows of a table (``pg_class`` statistics)."""

    bytes: int
    blocks: int
    est_rows: int

    @property
    def row_bytes(self) -> int:
        """Average heap bytes per row (a proxy for the text width of a row)."""
        return max(16, self.bytes // self.est_rows) if self.est_rows > 0 else 128


def table_size(conn: psycopg2.extensions.connection, schema: str, table: str) -> TableSize:
    """Heap bytes, blocks and an estimated row count now."""
    with conn.cursor() as cur:
        cur.execute(
            """SELECT pg_relation_size(c.oid, 'main'), current_setting('block_size')::bigint,
                      c.reltuples::bigint, c.relpages
               FROM pg_class c WHERE c.oid = format('%%I.%%I', %s::text, %s::text)::regclass""",
            (schema, table),
        )
        size, block, reltuples, relpages = cur.fetchone()
    return _size(size, block, reltuples, relpages)


def table_sizes(conn: psycopg2.extensions.connection,
                names: Sequence[tuple[str, str]]) -> dict[tuple[str, str], TableSize]:
    """:func:`table_size` of many tables in one query (a table not found is left out; its
    own :func:`table_size` then raises the usual error)."""
    if not names:
        return {}
    with conn.cursor() as cur:
        cur.execute(
            """SELECT n.s, n.t, pg_relation_size(c.oid, 'main'),
                      current_setting('block_size')::bigint, c.reltuples::bigint, c.relpages
               FROM unnest(%s::text[], %s::text[]) AS n(s, t)
               JOIN pg_class c ON c.oid = to_regclass(format('%%I.%%I', n.s, n.t))""",
            ([s for s, _ in names], [t for _, t in names]))
        rows = cur.fetchall()
    return {(s, t): _size(size, block, reltuples, relpages)
            for s, t, size, block, reltuples, relpages in rows}


def _size(size: int, block: int, reltuples: int, relpages: int) -> TableSize:
    blocks = int(size) // int(block)
    est = int(reltuples)
    if est < 0 or relpages <= 0:
        est = -1  # never analysed
    elif relpages != blocks and relpages > 0:
        est = int(est * blocks / relpages)
    return TableSize(int(size), blocks, est)


def table_blocks(conn: psycopg2.extensions.connection, schema: str, table: str) -> int:
    """Number of heap blocks of the table now (an upper bound for any older snapshot)."""
    return table_size(conn, schema, table).blocks


def chunk_counts(table_bytes: Sequence[int], chunk_bytes: int, slots: int) -> list[int]:
    """How many chunks each table is read in: one per ``chunk_bytes`` of heap; and while the
    snapshot has fewer chunks than task slots, the table with the most heap per chunk is
    split once more, as long as each of its chunks keeps :data:`PARALLEL_MIN_CHUNK_BYTES`
    (so a snapshot of one or a few tables uses every core, and many tables are not split
    for nothing).

    When there are more chunks than slots, the chunks of the tables read in several are
    then made a multiple of ``slots`` (the same way, while each keeps
    :data:`PARALLEL_MIN_CHUNK_BYTES`): 3 chunks on 2 slots read the third alone on one core
    while the other idles, 4 smaller ones keep both busy to the end."""
    counts = [max(1, -(-size // max(chunk_bytes, 1))) for size in table_bytes]

    def split_once(candidates: Sequence[int]) -> bool:
        best = max(candidates, key=lambda i: table_bytes[i] / (counts[i] + 1))
        if table_bytes[best] // (counts[best] + 1) < PARALLEL_MIN_CHUNK_BYTES:
            return False
        counts[best] += 1
        return True

    while counts and sum(counts) < slots and split_once(range(len(counts))):
        pass
    while slots > 1 and sum(counts) > slots:
        split = [i for i, count in enumerate(counts) if count > 1]
        if not split or sum(counts[i] for i in split) % slots == 0 or not split_once(split):
            break
    return counts


def plan_chunks(schema: str, table: str, blocks: int, blocks_per_chunk: int) -> list[Chunk]:
    """Split ``blocks`` heap blocks into CTID ranges; the last range is open-ended."""
    step = max(1, blocks_per_chunk)
    chunks = []
    start = 0
    index = 0
    while True:
        end = start + step
        if end >= blocks:
            chunks.append(Chunk(schema, table, index, "ctid", start_block=start))
            return chunks
        chunks.append(Chunk(schema, table, index, "ctid", start_block=start, end_block=end))
        start = end
        index += 1


def _ranges(schema: str, table: str, bounds: Sequence[tuple[str, ...]]) -> list[Chunk]:
    edges: list[tuple[str, ...] | None] = [None, *bounds, None]
    return [Chunk(schema, table, i, "key", edges[i], edges[i + 1])
            for i in range(len(edges) - 1)]


def plan_key_chunks(conn: psycopg2.extensions.connection, schema: str, table: str,
                    key: Sequence[KeyColumn], chunks: int, size: TableSize) -> list[Chunk]:
    """Split the key space into about ``chunks`` ranges that partition it.

    Boundaries are quantiles of the keys: for a single key column of a type without
    collation (:data:`HISTOGRAM_TYPES`), those of its ``pg_stats`` histogram when ANALYZE
    has made one (a row-level sample, so ranges hold nearly equal rows, and no read of the
    table); otherwise those of a ``TABLESAMPLE SYSTEM`` sample of the keys: whole random
    heap blocks, ``SAMPLE_BLOCKS_PER_CHUNK`` per range (at most ``SAMPLE_MAX_BLOCKS``), so
    that a table stored in key order still yields spread-out keys, and skewed or sparse keys
    give ranges of similar size. They only balance the work: whatever they are (the
    statistics may be stale), the ranges cover every key exactly once, since the
    boundaries are sorted by the key's own ordering.
    """
    if chunks <= 1 or not key:
        return _ranges(schema, table, [])
    histogram = _histogram_bounds(conn, schema, table, key)
    if len(histogram) > chunks:
        return _ranges(schema, table, _picked(histogram, chunks, len(histogram) - 1))
    wanted = min(max(chunks * SAMPLE_BLOCKS_PER_CHUNK, 200), SAMPLE_MAX_BLOCKS)
    percent = 100.0 if size.blocks <= wanted else 100.0 * wanted / size.blocks
    # Aliases keep ORDER BY on the key columns themselves (not on their text).
    cols = sql.SQL(", ").join(
        sql.SQL("_t.{}::text AS {}").format(sql.Identifier(k.name), sql.Identifier(f"_k{i}"))
        for i, k in enumerate(key))
    order = sql.SQL(", ").join(sql.SQL("_t.{}").format(sql.Identifier(k.name)) for k in key)
    with conn.cursor() as cur:
        set_session(cur, local=False)
        cur.execute(sql.SQL("SELECT {} FROM {} AS _t TABLESAMPLE SYSTEM ({}) ORDER BY {}")
                    .format(cols, sql.Identifier(schema, table), sql.Literal(percent), order))
        sample = cur.fetchall()
    if len(sample) < chunks:
        return _ranges(schema, table, [])
    return _ranges(schema, table, _picked(sample, chunks, len(sample)))


def _picked(values: Sequence[Sequence[str]], chunks: int, span: int
            ) -> list[tuple[str, ...]]:
    """The ``chunks - 1`` boundaries at even steps through ``values`` (sorted keys), each
    once."""
    bounds: list[tuple[str, ...]] = []
    for i in range(1, chunks):
        pick = tuple(values[(span * i) // chunks])
        if not bounds or pick != bounds[-1]:
            bounds.append(pick)
    return bounds


HISTOGRAM_TYPES = frozenset({"smallint", "integer", "bigint", "uuid", "date",
                             "timestamp without time zone", "timestamp with time zone"})
"""Key types whose ``pg_stats`` histogram may place chunk boundaries (``numeric(p,s)`` too):
no collation, so the histogram's order is the order the range conditions compare in."""


def _histogram_bounds(conn: psycopg2.extensions.connection, schema: str, table: str,
                      key: Sequence[KeyColumn]) -> list[tuple[str]]:
    """The single key column's ``pg_stats`` histogram bounds as text, sorted by the key's
    ordering (the parent's statistics over its children first, as the chunk's ``SELECT``
    reads them); [] when there is none or the key does not qualify. Sorted by the typed
    value (``_h._b``), never by its text: ``'142131' < '57534'``."""
    if len(key) != 1:
        return []
    (column,) = key
    if column.sql_type not in HISTOGRAM_TYPES and \
            not re.fullmatch(r"numeric(\(\d+(,\d+)?\))?", column.sql_type):
        return []
    with conn.cursor() as cur:
        set_session(cur, local=False)
        execute(cur, sql.SQL(
            "SELECT _h._b::text AS bound FROM unnest((SELECT histogram_bounds::text::{}[] "
            "FROM pg_stats WHERE schemaname = {} AND tablename = {} AND attname = {} "
            "ORDER BY inherited DESC LIMIT 1)) AS _h(_b) ORDER BY _h._b").format(
                sql.SQL(column.sql_type), sql.Placeholder(), sql.Placeholder(),
                sql.Placeholder()), (schema, table, column.name))
        return [(str(row[0]),) for row in cur.fetchall()]


# --- queries -----------------------------------------------------------------------------

def _row(values: Sequence[str], key: Sequence[KeyColumn]) -> sql.Composable:
    items = [sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(k.sql_type))
             for v, k in zip(values, key, strict=True)]
    return sql.SQL("({})").format(sql.SQL(", ").join(items))


BYTE_ORDER_TYPES = re.compile(r"^(text|name|citext|character varying|character|varchar|"
                              r"bpchar)(\(\d+\))?$")
"""Key types ``ORDER BY`` sorts with ``COLLATE "C"`` (code point order, the order of the
strings silver's file statistics compare) instead of the column's collation."""


def chunk_query(chunk: Chunk, columns: Sequence[str], key: Sequence[KeyColumn] = (),
                override: str | None = None, *, ordered: bool = False) -> sql.Composed:
    """The chunk's ``SELECT``: the table (or the validated override) restricted to the chunk;
    ``ordered``: a key chunk's rows in key order (text keys in code point order), for silver
    files laid out by key (``spark/snapshot_tasks.py``).

    Key types come from the catalog (``format_type``), never from user input; an override
    has been validated as a single read-only SELECT by :func:`validate_override`.
    """
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    source: sql.Composable = sql.Identifier(chunk.schema, chunk.table)
    if override is not None:
        source = sql.SQL("({}) AS _pgcdc_override").format(sql.SQL(override))
    cond: list[sql.Composable] = []
    if chunk.kind == "ctid":
        if override is not None:
            raise ConfigurationError(f"{chunk}: a SELECT override cannot be split by CTID")
        cond.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({chunk.start_block},0)")))
        if chunk.end_block is not None:
            cond.append(sql.SQL("ctid < {}::tid").format(
                sql.Literal(f"({chunk.end_block},0)")))
    else:
        names = sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(k.name) for k in key))
        if chunk.lower is not None:
            cond.append(sql.SQL("{} >= {}").format(names, _row(chunk.lower, key)))
        if chunk.upper is not None:
            cond.append(sql.SQL("{} < {}").format(names, _row(chunk.upper, key)))
    query = sql.SQL("SELECT {} FROM {}").format(cols, source)
    if cond:
        query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(cond))
    if ordered and chunk.kind != "ctid" and key:
        query = sql.SQL("{} ORDER BY {}").format(query, sql.SQL(", ").join(
            sql.SQL('{} COLLATE "C"' if BYTE_ORDER_TYPES.match(k.sql_type) else "{}").format(
                sql.Identifier(k.name)) for k in key))
    return query


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


# --- reading -----------------------------------------------------------------------------

_UNESCAPE = {"\\": "\\", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_ESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)


def unescape_copy_text(value: str) -> str:
    """Undo COPY text-format escaping (COPY TO writes only these escapes)."""
    return _ESCAPE_RE.sub(lambda m: _UNESCAPE.get(m.group(1), m.group(1)), value)


def _unescape_column(col: pa.Array) -> pa.Array:
    mask = pc.match_substring(col, "\\")
    if not pc.any(mask).as_py():
        return col
    texts = col.to_pylist()
    flags = pc.fill_null(mask, False)
    repl = [unescape_copy_text(t) for t, f in zip(texts, flags.to_pylist(), strict=True)
            if f and t is not None]
    return pc.replace_with_mask(col, flags, pa.array(repl, pa.string()))


PLAIN_TYPES = frozenset({
    "int2", "int4", "int8", "float4", "float8", "numeric", "bool", "date", "time", "timetz",
    "timestamp", "timestamptz", "interval", "uuid", "inet", "cidr", "macaddr", "macaddr8",
    "oid", "pg_lsn"})
"""Types whose text output never holds a backslash or a control character (no COPY escape)."""


def unescape_batch(batch: pa.RecordBatch, escaped: Collection[int] | None) -> pa.RecordBatch:
    cols = [_unescape_column(c) if escaped is None or i in escaped else c
            for i, c in enumerate(batch.columns)]
    return pa.RecordBatch.from_arrays(cols, schema=batch.schema)


def text_reader(source: Any, columns: Sequence[str],
                 block_size: int) -> pacsv.CSVStreamingReader:
    names = list(columns)
    return pacsv.open_csv(
        source,
        read_options=pacsv.ReadOptions(column_names=names, block_size=block_size,
                                       use_threads=False),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False,
                                         newlines_in_values=False, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(
            column_types={n: pa.string() for n in names},
            strings_can_be_null=True,
            null_values=["\\N"],
            check_utf8=False,  # client_encoding UTF8: the server sends valid UTF-8 only
        ),
    )


def block_bytes(fetch_size: int, row_bytes: int) -> int:
    """Parser block for ``snapshot.fetch.size`` rows of about ``row_bytes`` text bytes.

    COPY streams rows as the server produces them, so the fetch size cannot bound a network
    round trip as it does for Debezium's JDBC cursor; it sizes the unit the reader parses,
    within [``MIN_BLOCK_BYTES``, ``MAX_BLOCK_BYTES``] so memory stays bounded.
    """
    return max(MIN_BLOCK_BYTES, min(MAX_BLOCK_BYTES, fetch_size * max(row_bytes, 1)))


def _translate(exc: psycopg2.Error, label: str) -> Exception:
    message = (exc.pgerror or str(exc) or type(exc).__name__).strip().splitlines()[0]
    if isinstance(exc, psycopg2.errors.UndefinedTable | psycopg2.errors.UndefinedColumn):
        return TableVanishedError(
            f"{label}: {message}. The table or column was dropped or renamed after the "
            "snapshot was planned. Remove it from table.include.list (or restore it) and run "
            "the snapshot again; chunks already read are kept.")
    if isinstance(exc, psycopg2.errors.ReadOnlySqlTransaction):
        return ConfigurationError(
            f"{label}: {message}. Snapshot reads run in READ ONLY transactions; a "
            "snapshot.select.statement.overrides SELECT must not write (no nextval(), no "
            "functions that modify data).")
    if isinstance(exc, psycopg2.errors.InvalidParameterValue) and "snapshot" in message:
        return SnapshotExpiredError(
            f"{label}: {message}. The exported snapshot is gone (its replication connection "
            "closed before every chunk was read). Run the snapshot again; it resumes with the "
            "chunks not yet read.")
    if "cannot allocate memory" in message or "no message from the libpq" in message:
        return PgCdcError(
            f"{label}: {message}. The chunk reader most likely ran out of memory receiving a "
            "row (libpq reports a failed buffer allocation this way): a row larger than the "
            "memory of the Python worker, or spark.executor.pyspark.memory set too low (with "
            "pyarrow's default allocator a worker reserves about 1.8 GiB of address space "
            "while using a few hundred MB). Raise the limit and run the snapshot again; "
            "chunks already read are kept.")
    same: Exception = exc
    return same


def open_snapshot_transaction(dsn: str, snapshot_name: str | None, *,
                              label: str = "snapshot read") -> psycopg2.extensions.connection:
    """A connection in a REPEATABLE READ READ ONLY transaction that imported
    ``snapshot_name``, with the session settings pinned: for many reads of one snapshot
    (``within=`` of :func:`read_text_batches` and ``binary_read.read_binary_rows``). The
    caller ends the transaction and closes the connection.

    Raises:
        SnapshotExpiredError: ``snapshot_name`` can no longer be imported.
    """
    conn = connect(dsn, autocommit=False, application_name="pgcdc_dagster chunk reader")
    try:
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            if snapshot_name:
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
            set_session(cur)
    except psycopg2.Error as exc:
        conn.close()
        raise _translate(exc, label) from None
    except BaseException:
        conn.close()
        raise
    return conn


def read_text_batches(dsn: str, snapshot_name: str | None, query: sql.Composable,
                      columns: Sequence[str], *, block_size: int = CSV_BLOCK_BYTES,
                      label: str = "snapshot read",
                      escaped: Collection[int] | None = None,
                      statement_timeout_ms: int = 0,
                      within: psycopg2.extensions.connection | None = None,
                      ) -> Iterator[pa.RecordBatch]:
    """Yield batches of the query's rows, every column as text (NULL as null).

    With ``snapshot_name`` the query runs in a REPEATABLE READ READ ONLY transaction that
    imports that exported snapshot, so every chunk sees the same consistent state.
    ``within``: run the query in that connection's open transaction instead (many reads of
    one snapshot on one connection; the caller ends the transaction and closes it).
    ``label`` names the work in error messages; ``escaped`` lists the columns whose values
    may hold COPY escapes (None = all; see :data:`PLAIN_TYPES`). ``statement_timeout_ms``
    > 0 cancels the query after that long (user SQL: filters, overrides).

    Raises:
        TableVanishedError: the table or a column no longer exists.
        SnapshotExpiredError: ``snapshot_name`` can no longer be imported.
    """
    conn = within if within is not None else \
        connect(dsn, autocommit=False, application_name="pgcdc_dagster chunk reader")
    copy = sql.SQL("COPY ({}) TO STDOUT").format(query).as_string(conn)
    read_fd, write_fd = os.pipe()
    source = os.fdopen(read_fd, "rb", closefd=True)
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(write_fd, "wb", buffering=1 << 16, closefd=True) as sink, \
                    conn.cursor() as cur:
                if within is None:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    if snapshot_name:
                        cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
                set_session(cur)
                if statement_timeout_ms:
                    set_timeout(cur, statement_timeout_ms)
                cur.copy_expert(copy, sink, size=1 << 20)
        except BaseException as exc:
            failure.append(exc)

    def failed() -> Exception | None:
        thread.join()
        if not failure:
            return None
        exc = failure[0]
        if isinstance(exc, psycopg2.errors.QueryCanceled) and statement_timeout_ms:
            return timed_out(exc, label, statement_timeout_ms)
        return _translate(exc, label) if isinstance(exc, psycopg2.Error) else \
            exc if isinstance(exc, Exception) else RuntimeError(repr(exc))

    thread = threading.Thread(target=produce, name="pgcdc-copy", daemon=True)
    thread.start()
    try:
        try:
            reader = text_reader(source, columns, block_size)
            for batch in reader:
                yield unescape_batch(batch, escaped)
        except pa.ArrowInvalid as exc:
            if "Empty CSV" not in str(exc):
                cause = failed()
                if cause is not None:
                    raise cause from None
                raise
        cause = failed()
        if cause is not None:
            raise cause from None
    finally:
        if thread.is_alive():
            conn.cancel()  # the consumer stopped early: end the COPY, unblock the writer
        source.close()
        thread.join(timeout=60)
        if within is None and not conn.closed:
            conn.rollback()
            conn.close()


# --- consistent points -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ExportedPoint:
    """A slot's consistent point and the snapshot exported there."""

    slot: str
    lsn: int
    snapshot_name: str


@contextmanager
def temporary_exported_snapshot(dsn: str, slot: str) -> Iterator[ExportedPoint]:
    """A TEMPORARY logical slot with an exported snapshot, alive for the block.

    The snapshot shows exactly the transactions whose commit precedes the slot's consistent
    point; the temporary slot (dropped when its connection closes) only serves that export.
    """
    conn = connect(dsn, replication=True, application_name="pgcdc_dagster snapshot point")
    try:
        with conn.cursor() as cur:
            cur.execute(sql.SQL("CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput "
                                "EXPORT_SNAPSHOT").format(sql.Identifier(slot)).as_string(conn))
            name, point, snapshot, _plugin = cur.fetchone()
        yield ExportedPoint(str(name), int(Lsn.parse(point)), str(snapshot))
    finally:
        conn.close()
        _wait_slot_dropped(dsn, slot)


def _wait_slot_dropped(dsn: str, slot: str, timeout_s: float = 10.0) -> None:
    """Wait until the server has dropped the closed session's temporary slot.

    The walsender drops it while exiting, a moment after the client closed the connection;
    callers (and users looking at ``pg_replication_slots``) must not see it pinning WAL
    after the snapshot is done. Best effort: a slow exit is left to the server.
    """
    deadline = time.monotonic() + timeout_s
    try:
        with connection(dsn) as check, check.cursor() as cur:
            while time.monotonic() < deadline:
                cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
                if cur.fetchone() is None:
                    return
                time.sleep(0.02)
    except (psycopg2.Error, PgCdcError):  # never hide the error the block may be raising
        return


def create_plain_slot(conn: psycopg2.extensions.connection, slot: str,
                      plugin: str = "pgoutput", *, failover: bool = False) -> int:
    """Create a logical slot of ``plugin`` without a snapshot (``no_data``); return its
    consistent point. ``failover``: a failover slot on PostgreSQL 17+ (``slot.failover``)."""
    with conn.cursor() as cur:
        if failover:  # 17+, and not on a standby (a standby's slot cannot fail over)
            cur.execute("SELECT current_setting('server_version_num')::int >= 170000 "
                        "AND NOT pg_is_in_recovery()")
            failover = bool(cur.fetchone()[0])
        if failover:
            cur.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s, "
                        "false, false, true)", (slot, plugin))
        else:
            cur.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s)",
                        (slot, plugin))
        return int(Lsn.parse(cur.fetchone()[0]))


def published_tables(conn: psycopg2.extensions.connection,
                     publication: str) -> set[tuple[str, str]] | None:
    """Tables of the publication (None for a FOR ALL TABLES publication or a missing one)."""
    with conn.cursor() as cur:
        cur.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s", (publication,))
        row = cur.fetchone()
        if row is None or row[0]:
            return None
        cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                    (publication,))
        return {(str(s), str(t)) for s, t in cur.fetchall()}
