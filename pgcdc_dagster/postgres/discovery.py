"""Server checks and resolution of the table include list against the source catalog."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psycopg2.extensions

from pgcdc_dagster.cdc.changes import Column, Relation
from pgcdc_dagster.cdc.column_names import column_name_problems
from pgcdc_dagster.cdc.plugins import PGOUTPUT_WIRE
from pgcdc_dagster.exceptions import ConfigurationError, MissingPrimaryKeyError, TableNotFoundError
from pgcdc_dagster.names import display_name

MIN_SERVER_VERSION = 140000
STANDBY_DECODING_SERVER_VERSION = 160000
"""Logical decoding on a hot standby (slots, snapshots, peeks) came with PostgreSQL 16."""

_TABLES_SQL = """
SELECT c.oid, n.nspname, c.relname, c.relreplident, c.relpersistence,
       has_table_privilege(c.oid, 'SELECT')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%%'
  AND n.nspname NOT LIKE 'pg_temp%%'
ORDER BY n.nspname, c.relname
"""

_COLUMNS_SQL = """
SELECT a.attrelid, a.attname, a.atttypid, a.atttypmod
FROM pg_attribute a
WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped
  AND a.attgenerated = ''
ORDER BY a.attrelid, a.attnum
"""

_KEY_SQL = """
SELECT i.indrelid, i.indisprimary, i.indisreplident, a.attname
FROM pg_index i
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = ANY(%s::oid[]) AND (i.indisprimary OR i.indisreplident)
ORDER BY i.indrelid, i.indisprimary DESC, k.ord
"""


def check_server(conn: psycopg2.extensions.connection) -> int:
    """Check the source can do logical decoding; return ``server_version_num``."""
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('server_version_num')::int, "
                    "current_setting('wal_level'), pg_is_in_recovery()")
        version, wal_level, standby = cur.fetchone()
    if standby and version < STANDBY_DECODING_SERVER_VERSION:
        raise ConfigurationError(
            f"the source is a standby running PostgreSQL {version // 10000}: logical decoding "
            "on a standby needs PostgreSQL 16 or newer. Point PGCDC_PG_DSN at the primary.")
    if version < MIN_SERVER_VERSION:
        raise ConfigurationError(
            f"the source runs PostgreSQL {version // 10000}; pgcdc_dagster needs 14 or newer "
            "(pgoutput messages and streaming)."
        )
    if wal_level != "logical":
        raise ConfigurationError(
            f"the source has wal_level = '{wal_level}', but change data capture needs 'logical'. "
            "Fix: ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL."
        )
    return int(version)


def _matches(patterns: Sequence[str], schema: str, table: str) -> bool:
    name = f"{schema}.{table}"
    return any(re.fullmatch(p, name) for p in patterns)


def compile_patterns(patterns: Sequence[str], setting: str) -> list[str]:
    """Validate Debezium-style ``schema.table`` regular expressions."""
    out = []
    for raw in patterns:
        pattern = raw.strip()
        if not pattern:
            continue
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigurationError(
                f"{setting}: {pattern!r} is not a valid regular expression: {exc}") from None
        out.append(pattern)
    return out


KeyFor = Callable[[str, str, Sequence[str]], Sequence[str] | None]
"""``message.key.columns`` lookup: (schema, table, column names) -> key columns or None."""


@dataclass(frozen=True)
class SkippedTable:
    """A table the include list matches that cannot be captured, and why."""

    schema: str
    table: str
    reason: str
    fix: str

    def describe(self) -> str:
        return f"{display_name(self.schema, self.table)}: {self.reason} (fix: {self.fix})"


@dataclass
class Resolution:
    """The tables to capture, and those left out (matched, but not capturable)."""

    relations: list[Relation] = field(default_factory=list)
    skipped: list[SkippedTable] = field(default_factory=list)

    def warning(self) -> str:
        """One message listing the skipped tables (empty when none)."""
        if not self.skipped:
            return ""
        return (f"{len(self.skipped)} table(s) matched by the include list are left out of "
                "capture (the others are captured): "
                + "; ".join(t.describe() for t in self.skipped))


def nothing_to_capture(include: Sequence[str], skipped: Sequence[SkippedTable]
                       ) -> ConfigurationError:
    """The refusal of a capture without a table: the include list (or the whole source)
    matches only tables that cannot be captured (``CREATE PUBLICATION`` would otherwise
    fail with a bare syntax error)."""
    what = ("PGCDC_TABLES (table.include.list) matches only tables that cannot be captured"
            if include else "the source has no table that can be captured")
    left = "; ".join(t.describe() for t in skipped) or "none"
    return ConfigurationError(
        f"nothing to capture: {what}. Left out: {left}. Fix those tables as each reason "
        "says, or set PGCDC_TABLES to tables that have a key.")


def names_table(patterns: Sequence[str], schema: str, table: str) -> bool:
    """True when a pattern names ``schema.table`` literally (``public.events`` or
    ``public\\.events``), not through a wildcard: an explicit request for that table."""
    return any(re.sub(r"\\(.)", r"\1", p) == f"{schema}.{table}" for p in patterns)


def unusable(schema: str, table: str, persistence: str, readable: bool,
             replica_identity: str) -> SkippedTable | None:
    """Why a matched table cannot be captured whatever its key (None: it can be)."""
    name = display_name(schema, table)
    if persistence == "u":
        return SkippedTable(schema, table, "an UNLOGGED table writes no WAL, so logical "
                            "decoding never sees its changes", f"ALTER TABLE {name} SET LOGGED")
    if not readable:
        return SkippedTable(schema, table, "the capture user has no SELECT privilege on it, "
                            "so it cannot be snapshotted",
                            f"GRANT SELECT ON {name} TO <capture user>")
    if replica_identity == "n":
        return SkippedTable(schema, table, "REPLICA IDENTITY NOTHING: publishing it would "
                            "make the source's own UPDATE and DELETE on it fail",
                            replica_identity_fix(schema, table))
    return None


def resolve_tables(conn: psycopg2.extensions.connection, include: Sequence[str],
                   exclude: Sequence[str] = (), *, key_for: KeyFor | None = None
                   ) -> list[Relation]:
    """The captured tables of :func:`resolve_capture` (the skipped ones left out)."""
    return resolve_capture(conn, include, exclude, key_for=key_for).relations


def resolve_capture(conn: psycopg2.extensions.connection, include: Sequence[str],
                    exclude: Sequence[str] = (), *, key_for: KeyFor | None = None
                    ) -> Resolution:
    """Resolve the include list: the captured tables, in name order, as relations whose key
    flags mark the key, and the matched tables left out.

    Patterns are Debezium ``table.include.list`` / ``table.exclude.list`` regular expressions
    matched against ``schema.table``. An empty include list captures every table. A table
    with neither a primary key nor a replica identity index is keyed by ``key_for``
    (``message.key.columns``) when it names columns of the table.

    A matched table that cannot be captured (no key, UNLOGGED, no SELECT privilege, REPLICA
    IDENTITY NOTHING, columns Delta cannot store side by side: ``cdc/column_names.py``) is
    left out with its reason and fix, so one such table does not stop
    the capture of the others, unless an include pattern names it literally (an explicit
    request): then the error is raised.

    Raises:
        TableNotFoundError: an include pattern matches no table.
        MissingPrimaryKeyError: a table the include list names has neither a primary key nor
            a replica identity index nor ``message.key.columns``.
        ConfigurationError: a table the include list names cannot be captured otherwise.
    """
    include = compile_patterns(include, "PGCDC_TABLES (table.include.list)")
    exclude = compile_patterns(exclude, "table.exclude.list")
    with conn.cursor() as cur:
        cur.execute(_TABLES_SQL)
        candidates = cur.fetchall()
    for pattern in include:
        names = [f"{s}.{t}" for _, s, t, *_ in candidates]
        if not any(re.fullmatch(pattern, name) for name in names):
            other_case = sorted(n for n in names if re.fullmatch(pattern, n, re.IGNORECASE))
            hint = (f" Patterns match the letter case of names (unlike Debezium's); "
                    f"{', '.join(map(repr, other_case[:5]))} match(es) it in another case: "
                    "write the name in its case, or start the pattern with (?i)."
                    if other_case else "")
            raise TableNotFoundError(
                f"no table in the source matches {pattern!r} from the include list. Check the "
                "name (schema.table, a regular expression), create the table, or remove it "
                f"from PGCDC_TABLES.{hint}"
            )
    matched = [row for row in candidates
               if (not include or _matches(include, row[1], row[2]))
               and not _matches(exclude, row[1], row[2])]
    # The keys and columns of every matched table in two queries, whatever their number.
    catalog = _describe_rows(conn, [int(row[0]) for row in matched])
    out = Resolution()
    for oid, schema, table, ident, persistence, readable in matched:
        explicit = names_table(include, schema, table)
        skipped = unusable(schema, table, str(persistence), bool(readable), str(ident))
        relation = None
        if skipped is None:
            try:
                key_rows, cols = catalog.get(int(oid), ([], []))
                relation = _relation(int(oid), schema, table, ident, key_rows, cols,
                                     key_for=key_for)
            except MissingPrimaryKeyError:
                if explicit:
                    raise
                skipped = keyless(schema, table)
        if relation is not None:
            skipped = unstorable(schema, table, [c.name for c in relation.columns])
        if skipped is not None:
            if explicit:
                raise _named_but_unusable(skipped)
            out.skipped.append(skipped)
            continue
        assert relation is not None
        out.relations.append(relation)
    return out


def _named_but_unusable(skipped: SkippedTable) -> ConfigurationError:
    return ConfigurationError(
        f"PGCDC_TABLES names {display_name(skipped.schema, skipped.table)}, which cannot be "
        f"captured: {skipped.reason}. Fix: {skipped.fix}; or remove it from PGCDC_TABLES.")


def leave_out_partitioned(conn: psycopg2.extensions.connection, found: Resolution,
                          include: Sequence[str], plugin: str) -> None:
    """Move the partitioned tables of ``found`` to its skipped ones when ``plugin`` names a
    change by the partition holding the row (wal2json, decoderbufs): their streamed changes
    could never reach the captured table. pgoutput publishes them via the root.

    Raises:
        ConfigurationError: the include list names such a table literally.
    """
    if plugin in PGOUTPUT_WIRE or not found.relations:
        return
    with conn.cursor() as cur:
        cur.execute("SELECT oid FROM pg_class WHERE relkind = 'p' AND oid = ANY(%s)",
                    ([r.oid for r in found.relations],))
        partitioned = {int(row[0]) for row in cur.fetchall()}
    if not partitioned:
        return
    patterns = compile_patterns(include, "PGCDC_TABLES (table.include.list)")
    kept = []
    for rel in found.relations:
        if rel.oid not in partitioned:
            kept.append(rel)
            continue
        skipped = SkippedTable(
            rel.namespace, rel.name, f"a partitioned table: the {plugin} plugin names each "
            "change by the partition holding the row, never by this table, so its changes "
            "would not be captured", "set plugin.name (PGCDC_PLUGIN_NAME) to pgoutput, which "
            "publishes them via the partitioned table, or exclude it (table.exclude.list)")
        if names_table(patterns, rel.namespace, rel.name):
            raise _named_but_unusable(skipped)
        found.skipped.append(skipped)
    found.relations = kept


def unstorable(schema: str, table: str, columns: Sequence[str]) -> SkippedTable | None:
    """Why a table whose columns Delta cannot store side by side is left out (columns
    differing only in letter case, or named like silver's metadata columns:
    ``cdc/column_names.py``), and the fix; None when it can be stored."""
    problems = column_name_problems(columns)
    if not problems:
        return None
    return SkippedTable(schema, table, "; ".join(problems),
                        "rename one of these columns at the source, or exclude the table "
                        "(table.exclude.list)")


def keyless(schema: str, table: str) -> SkippedTable:
    """Why a table without any key is left out, and the fix."""
    return SkippedTable(
        schema, table, "no primary key, replica identity index or message.key.columns, so "
        "its current state cannot be keyed (and publishing it would make the source's own "
        "UPDATE and DELETE on it fail)",
        "add a primary key, or name its key in message.key.columns with REPLICA IDENTITY "
        "FULL, or exclude it (table.exclude.list)")


def describe_table(conn: psycopg2.extensions.connection, oid: int, schema: str, table: str,
                   replica_identity: str, *, key_for: KeyFor | None = None) -> Relation:
    """Build a Relation for one table from the catalog, key columns flagged (a keyless
    table's from ``key_for``, ``message.key.columns``)."""
    key_rows, cols = _describe_rows(conn, [oid]).get(oid, ([], []))
    return _relation(oid, schema, table, replica_identity, key_rows, cols, key_for=key_for)


_KeyRow = tuple[bool, bool, str]
_ColumnRow = tuple[str, int, int]


def _describe_rows(conn: psycopg2.extensions.connection, oids: Sequence[int]
                   ) -> dict[int, tuple[list[_KeyRow], list[_ColumnRow]]]:
    """The key-index rows and the live columns of every table in ``oids`` (two queries)."""
    out: dict[int, tuple[list[_KeyRow], list[_ColumnRow]]] = {o: ([], []) for o in oids}
    if not oids:
        return out
    with conn.cursor() as cur:
        cur.execute(_KEY_SQL, (list(oids),))
        for relid, primary, ident, name in cur.fetchall():
            out[int(relid)][0].append((bool(primary), bool(ident), str(name)))
        cur.execute(_COLUMNS_SQL, (list(oids),))
        for relid, name, typ, mod in cur.fetchall():
            out[int(relid)][1].append((str(name), int(typ), int(mod)))
    return out


def _relation(oid: int, schema: str, table: str, replica_identity: str,
              key_rows: Sequence[_KeyRow], cols: Sequence[_ColumnRow], *,
              key_for: KeyFor | None) -> Relation:
    """:func:`describe_table` from the catalog rows read for it."""
    # REPLICA IDENTITY USING INDEX: pgoutput's old images (deletes, updates of the index
    # columns) carry the index columns only, so they are the key (seed 002: the key holds
    # "the unique key constraint with REPLICA IDENTITY set to ... USING INDEX"); a primary
    # key that is not the identity would reach a delete as NULLs and a change of it
    # without an old image at all.
    by_index = replica_identity == "i" and any(ident for _, ident, _ in key_rows)
    has_pk = any(primary for primary, _, _ in key_rows)
    if by_index:
        key = [name for _, ident, name in key_rows if ident]
    else:
        key = [name for primary, _, name in key_rows if primary == has_pk]
    if not key and key_for is not None:
        key = list(key_for(schema, table, [str(c[0]) for c in cols]) or ())
    if not key:
        name = display_name(schema, table)
        raise MissingPrimaryKeyError(
            f"table {name} has no primary key, so its current state cannot be keyed. "
            f"Fix: add one (ALTER TABLE {name} ADD PRIMARY KEY (...)), or set REPLICA "
            "IDENTITY USING INDEX on a unique index of NOT NULL columns, or name its key in "
            "message.key.columns (with REPLICA IDENTITY FULL), or exclude the table from "
            "PGCDC_TABLES."
        )
    key_set = set(key)
    columns = tuple(Column(name, int(typ), int(mod), name in key_set) for name, typ, mod in cols)
    return Relation(int(oid), schema, table, str(replica_identity), columns)


_NO_IDENTITY_SQL = """
SELECT n.nspname, c.relname, c.relreplident
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%%'
  AND n.nspname NOT LIKE 'pg_temp%%' AND c.relpersistence = 'p'
  AND (c.relreplident = 'n'
       OR (c.relreplident = 'd' AND NOT EXISTS (
             SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))
       OR (c.relreplident = 'i' AND NOT EXISTS (
             SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)))
ORDER BY n.nspname, c.relname
"""


def tables_without_replica_identity(conn: psycopg2.extensions.connection,
                                    tables: Sequence[tuple[str, str]] | None = None
                                    ) -> list[tuple[str, str, str]]:
    """``(schema, table, relreplident)`` of the tables with no replica identity (STR-45).

    A table has none under REPLICA IDENTITY NOTHING, under DEFAULT without a primary key,
    or under USING INDEX once the index is gone. In a publication that publishes updates or
    deletes, PostgreSQL refuses the source's own UPDATE and DELETE on such a table ("cannot
    update table ... because it does not have a replica identity and publishes updates").
    ``tables`` restricts the answer (None: every permanent table of the database; partitions
    included, as PostgreSQL checks the partition a row is in).
    """
    with conn.cursor() as cur:
        cur.execute(_NO_IDENTITY_SQL)
        rows = [(str(s), str(t), str(r)) for s, t, r in cur.fetchall()]
    if tables is None:
        return rows
    wanted = set(tables)
    return [r for r in rows if (r[0], r[1]) in wanted]


def replica_identity_fix(schema: str, table: str) -> str:
    """How to give ``schema.table`` a replica identity (the error text's fix)."""
    return (f"ALTER TABLE {display_name(schema, table)} REPLICA IDENTITY FULL (or ADD "
            "PRIMARY KEY, or "
            "REPLICA IDENTITY USING INDEX on a unique index of NOT NULL columns)")


def table_exists(conn: psycopg2.extensions.connection, schema: str, table: str) -> bool:
    """True when ``schema.table`` exists."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL",
                    (schema, table))
        return bool(cur.fetchone()[0])


def current_database(conn: psycopg2.extensions.connection) -> str:
    """Name of the database the connection is on (Debezium ``source.db``)."""
    with conn.cursor() as cur:
        cur.execute("SELECT current_database()")
        return str(cur.fetchone()[0])
