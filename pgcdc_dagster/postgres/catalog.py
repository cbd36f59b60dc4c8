"""Type and column information from the PostgreSQL catalog, for ``cdc.typeconv``.

``load_types`` reads ``pg_type`` (with ``pg_namespace``, ``pg_enum`` and ``pg_range``) and
resolves array elements, domain bases and range subtypes recursively into
:class:`~pgcdc_dagster.cdc.typeconv.PgType` values. ``table_columns`` reads ``pg_attribute``;
``column_facts`` reads the NOT NULL flags and defaults of many tables in one query. Values
are always passed as query parameters; nothing is interpolated into SQL text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from pgcdc_dagster.cdc.typeconv import PgType
from pgcdc_dagster.exceptions import TableNotFoundError

_TYPES_SQL = """
SELECT t.oid, n.nspname, t.typname, t.typtype, t.typcategory, t.typelem, t.typbasetype,
       t.typtypmod, r.rngsubtype, t.typdelim::text,
       ARRAY(SELECT e.enumlabel::text FROM pg_catalog.pg_enum e
             WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder) AS labels
FROM pg_catalog.pg_type t
JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
LEFT JOIN pg_catalog.pg_range r ON r.rngtypid = t.oid
WHERE t.oid = ANY(%s::oid[])
"""

_COLUMNS_SQL = """
SELECT a.attname, a.atttypid, a.atttypmod, a.attnotnull, a.attndims,
       CASE WHEN a.attgenerated = '' THEN pg_catalog.pg_get_expr(d.adbin, d.adrelid) END
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_FACTS_SQL = """
SELECT a.attrelid, a.attname, a.attnotnull,
       CASE WHEN a.attgenerated = '' THEN pg_catalog.pg_get_expr(d.adbin, d.adrelid) END
FROM pg_catalog.pg_attribute a
LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped
"""

_TABLE_EXISTS_SQL = """
SELECT 1 FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""

_Row = tuple[int, str, str, str, str, int, int, int, int | None, str, list[str]]


def _fetch(conn: Any, oids: Iterable[int]) -> dict[int, _Row]:
    """Read the catalog rows of ``oids`` and, transitively, of the types they refer to."""
    rows: dict[int, _Row] = {}
    wanted = {int(o) for o in oids}
    with conn.cursor() as cur:
        while wanted:
            cur.execute(_TYPES_SQL, (sorted(wanted),))
            found = {int(r[0]): tuple(r) for r in cur.fetchall()}
            rows.update(found)
            refs: set[int] = set()
            for row in found.values():
                refs.update(o for o in (row[5], row[6], row[8]) if o)
            wanted = {o for o in refs if o not in rows}
    return rows


def _build(oid: int, rows: dict[int, _Row], out: MutableMapping[int, PgType]) -> PgType:
    if oid in out:
        return out[oid]
    (_, schema, name, typtype, category, elem, basetype, typtypmod, subtype, delim,
     labels) = rows[oid]
    pgtype = PgType(
        oid=oid,
        schema=schema,
        name=name,
        typtype=typtype,
        category=category,
        element=_build(elem, rows, out) if elem and category == "A" else None,
        base=_build(basetype, rows, out) if typtype == "d" and basetype else None,
        enum_labels=tuple(labels or ()),
        subtype=_build(subtype, rows, out) if subtype else None,
        base_typmod=int(typtypmod) if typtype == "d" else -1,
        delimiter=delim or ",",
    )
    out[oid] = pgtype
    return pgtype


def load_types(conn: Any, oids: Iterable[int], *,
               cache: MutableMapping[int, PgType] | None = None) -> dict[int, PgType]:
    """The :class:`PgType` of every oid, with elements, domain bases and subtypes resolved.

    Args:
        conn: An open psycopg2 connection.
        oids: Type oids (e.g. from a pgoutput Relation message or :func:`table_columns`).
        cache: Optional per-connection cache, filled and reused. Drop it when a type may have
            changed (``ALTER TYPE ... ADD VALUE`` adds an enum label).

    Returns:
        oid -> PgType for each requested oid that exists.
    """
    store: MutableMapping[int, PgType] = cache if cache is not None else {}
    requested = [int(o) for o in oids]
    missing = [o for o in requested if o not in store]
    if missing:
        rows = _fetch(conn, missing)
        for oid in rows:
            _build(oid, rows, store)
    return {o: store[o] for o in requested if o in store}


def table_columns(conn: Any, schema: str, table: str) -> list[tuple[str, int, int, bool]]:
    """(name, type oid, typmod, not null) of the table's live columns, in column order.

    Raises:
        TableNotFoundError: if ``schema.table`` does not exist.
    """
    return [(n, o, m, nn) for n, o, m, nn, _, _ in _columns(conn, schema, table)]


def table_column_dimensions(conn: Any, schema: str, table: str) -> dict[str, int]:
    """Declared array dimensions (``attndims``) per column; 0 for non-array columns."""
    return {n: d for n, _, _, _, d, _ in _columns(conn, schema, table)}


def table_column_defaults(conn: Any, schema: str, table: str) -> dict[str, str]:
    """The default expression (``pg_get_expr``) of each column that has one (generated
    columns excluded)."""
    return {n: e for n, _, _, _, _, e in _columns(conn, schema, table) if e is not None}


@dataclass(frozen=True)
class ColumnFacts:
    """What a table's converters need beyond the columns' types: the NOT NULL columns and
    the default expression of each column that has one (generated columns excluded)."""

    not_null: frozenset[str] = frozenset()
    defaults: Mapping[str, str] = field(default_factory=dict)


def column_facts(conn: Any, oids: Iterable[int]) -> dict[int, ColumnFacts]:
    """:class:`ColumnFacts` of every table in ``oids``, read in one query whatever their
    number (a table that no longer exists gets empty facts)."""
    wanted = sorted({int(o) for o in oids})
    rows: dict[int, tuple[set[str], dict[str, str]]] = {o: (set(), {}) for o in wanted}
    if wanted:
        with conn.cursor() as cur:
            cur.execute(_FACTS_SQL, (wanted,))
            for relid, name, not_null, default in cur.fetchall():
                not_nulls, defaults = rows[int(relid)]
                if not_null:
                    not_nulls.add(str(name))
                if default is not None:
                    defaults[str(name)] = str(default)
    return {o: ColumnFacts(frozenset(n), d) for o, (n, d) in rows.items()}


def _columns(conn: Any, schema: str, table: str
             ) -> list[tuple[str, int, int, bool, int, str | None]]:
    with conn.cursor() as cur:
        cur.execute(_COLUMNS_SQL, (schema, table))
        rows = [(str(r[0]), int(r[1]), int(r[2]), bool(r[3]), int(r[4]),
                 None if r[5] is None else str(r[5])) for r in cur.fetchall()]
        if not rows:
            cur.execute(_TABLE_EXISTS_SQL, (schema, table))
            if cur.fetchone() is None:
                raise TableNotFoundError(
                    f"table {schema}.{table} does not exist in the source database; check "
                    "table.include.list and the connection's database")
    return rows
