"""Table discovery: source tables the include list matches that are not captured yet.

The Dagster definitions resolve the include list when the code location loads, so a table
created later has no assets until the location is reloaded. This compares the catalog now
with the captured set.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import psycopg2.extensions

from pgcdc_dagster.names import display_name
from pgcdc_dagster.postgres.discovery import (
    KeyFor,
    compile_patterns,
    keyless,
    unstorable,
    unusable,
)

_CANDIDATES_SQL = """
SELECT n.nspname, c.relname,
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid
               AND (i.indisprimary OR i.indisreplident)) AS keyed,
       c.relpersistence, has_table_privilege(c.oid, 'SELECT'), c.relreplident,
       ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid
             AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%%'
  AND n.nspname NOT LIKE 'pg_temp%%'
ORDER BY n.nspname, c.relname
"""


@dataclass
class DiscoveryReport:
    """How the source catalog differs from the captured tables."""

    new: list[tuple[str, str]] = field(default_factory=list)
    """Matched by the include list, capturable (keyed), not captured yet."""
    unkeyed: list[tuple[str, str]] = field(default_factory=list)
    """Matched, not captured, and not capturable (no key, UNLOGGED, no SELECT, ...)."""
    reasons: dict[tuple[str, str], str] = field(default_factory=dict)
    """Why each of ``unkeyed`` cannot be captured, and the fix."""
    gone: list[tuple[str, str]] = field(default_factory=list)
    """Captured, but no longer in the source (or no longer matched)."""

    @property
    def changed(self) -> bool:
        return bool(self.new or self.unkeyed or self.gone)


def _name(pair: tuple[str, str]) -> str:
    return display_name(*pair)


def discover(conn: psycopg2.extensions.connection, include: Sequence[str],
             exclude: Sequence[str], captured: Collection[tuple[str, str]], *,
             key_for: KeyFor | None = None) -> DiscoveryReport:
    """Compare the tables ``include``/``exclude`` match now with ``captured`` (a table is
    capturable by the rules of :func:`~pgcdc_dagster.postgres.discovery.resolve_capture`;
    ``key_for`` is ``message.key.columns``)."""
    inc = compile_patterns(include, "PGCDC_TABLES (table.include.list)")
    exc = compile_patterns(exclude, "table.exclude.list")
    with conn.cursor() as cur:
        cur.execute(_CANDIDATES_SQL)
        rows = cur.fetchall()
    captured_set = set(captured)
    report = DiscoveryReport()
    matched: set[tuple[str, str]] = set()
    for schema, table, keyed, persistence, readable, ident, columns in rows:
        name = f"{schema}.{table}"
        if inc and not any(re.fullmatch(p, name) for p in inc):
            continue
        if any(re.fullmatch(p, name) for p in exc):
            continue
        matched.add((schema, table))
        if (schema, table) in captured_set:
            continue
        skipped = unusable(schema, table, str(persistence), bool(readable), str(ident))
        if skipped is None and not keyed and not (key_for and key_for(schema, table, columns)):
            skipped = keyless(schema, table)
        if skipped is None:
            skipped = unstorable(schema, table, columns)
        if skipped is None:
            report.new.append((schema, table))
        else:
            report.unkeyed.append((schema, table))
            report.reasons[(schema, table)] = f"{skipped.reason} (fix: {skipped.fix})"
    report.gone = sorted(captured_set - matched)
    return report


def describe(report: DiscoveryReport) -> str:
    """A message telling the user what changed and what to do."""
    if not report.changed:
        return "the captured tables match the include list"
    parts = []
    if report.new:
        parts.append(
            "new tables match the include list but have no assets yet: "
            + ", ".join(map(_name, report.new))
            + ". Reload the code location (UI: Deployment > Code locations > Reload, or "
            "restart dagster) to create their bronze/silver assets; the next capture run "
            "adds them to the publication (docs/operations.md, 'Adding a table')")
    if report.unkeyed:
        parts.append(
            "tables match the include list but cannot be captured, so they are left out: "
            + "; ".join(f"{_name(t)}: {report.reasons.get(t, 'no key')}"
                        for t in report.unkeyed))
    if report.gone:
        parts.append(
            "captured tables are no longer in the source (dropped or renamed): "
            + ", ".join(map(_name, report.gone))
            + ". Reload the code location; their bronze and silver tables stay in the "
            "lakehouse")
    return ". ".join(parts)
