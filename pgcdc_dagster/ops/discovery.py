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

from pgcdc_dagster.postgres.discovery import compile_patterns

_CANDIDATES_SQL = """
SELECT n.nspname, c.relname,
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid
               AND (i.indisprimary OR i.indisreplident)) AS keyed
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
    """Matched, not captured, and without a primary key or replica identity index."""
    gone: list[tuple[str, str]] = field(default_factory=list)
    """Captured, but no longer in the source (or no longer matched)."""

    @property
    def changed(self) -> bool:
        return bool(self.new or self.unkeyed or self.gone)


def _name(pair: tuple[str, str]) -> str:
    return f"{pair[0]}.{pair[1]}"


def discover(conn: psycopg2.extensions.connection, include: Sequence[str],
             exclude: Sequence[str], captured: Collection[tuple[str, str]]) -> DiscoveryReport:
    """Compare the tables ``include``/``exclude`` match now with ``captured``."""
    inc = compile_patterns(include, "PGCDC_TABLES (table.include.list)")
    exc = compile_patterns(exclude, "table.exclude.list")
    with conn.cursor() as cur:
        cur.execute(_CANDIDATES_SQL)
        rows = [(str(s), str(t), bool(k)) for s, t, k in cur.fetchall()]
    captured_set = set(captured)
    report = DiscoveryReport()
    matched: set[tuple[str, str]] = set()
    for schema, table, keyed in rows:
        name = f"{schema}.{table}"
        if inc and not any(re.fullmatch(p, name) for p in inc):
            continue
        if any(re.fullmatch(p, name) for p in exc):
            continue
        matched.add((schema, table))
        if (schema, table) in captured_set:
            continue
        (report.new if keyed else report.unkeyed).append((schema, table))
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
            "tables match the include list but cannot be captured (no primary key or replica "
            "identity index): " + ", ".join(map(_name, report.unkeyed))
            + ". Add a primary key or exclude them (table.exclude.list)")
    if report.gone:
        parts.append(
            "captured tables are no longer in the source (dropped or renamed): "
            + ", ".join(map(_name, report.gone))
            + ". Reload the code location; their bronze and silver tables stay in the "
            "lakehouse")
    return ". ".join(parts)
