"""Snapshot chunk planning: the key to range over, table sizes, and the chunks.

Key ranges for every table with a key (a primary key or a replica identity index: btree,
NOT NULL, unique), boundaries from the key's ``pg_stats`` histogram or a ``TABLESAMPLE
SYSTEM`` sample; CTID block ranges when no key can be used (see
:mod:`pgcdc_dagster.postgres.snapshot_read` for the chunks' meaning).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from pgcdc_dagster.postgres.snapshot_read import Chunk, KeyColumn, set_session
from pgcdc_dagster.postgres.statements import execute

SAMPLE_BLOCKS_PER_CHUNK = 50
SAMPLE_MAX_BLOCKS = 20_000
PARALLEL_MIN_CHUNK_BYTES = 8 << 20
"""A table is spread over the snapshot's task slots while each chunk keeps this much heap."""


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
