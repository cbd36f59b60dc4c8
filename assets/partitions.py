"""The incremental snapshot's dynamic partitions: one per captured table.

Partitions are added by every bronze run (initial snapshot, micro-batch) and by the signal
sensor, so a backfill can be launched from the UI as soon as capture has run once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import dagster as dg

from pgcdc_dagster.postgres.signals import parse_table_name

INCREMENTAL_PARTITIONS = dg.DynamicPartitionsDefinition(name="pgcdc_incremental_tables")
"""One partition per captured table, ``<schema>.<table>`` (a part holding ``.`` or ``"``
is double-quoted, as in Debezium's ``data-collections``)."""

_PLAIN = re.compile(r'^[^."]+$')


def partition_key(schema: str, table: str) -> str:
    """The partition of a table: ``schema.table``, parts quoted only when needed."""
    def part(p: str) -> str:
        return p if _PLAIN.match(p) else '"' + p.replace('"', '""') + '"'

    return f"{part(schema)}.{part(table)}"


def partition_table(key: str) -> tuple[str, str]:
    """The ``(schema, table)`` of a partition key."""
    return parse_table_name(key)


def missing_partitions(instance: dg.DagsterInstance,
                       tables: Sequence[tuple[str, str]]) -> list[str]:
    """The captured tables' partition keys the instance does not have yet."""
    have = set(instance.get_dynamic_partitions(INCREMENTAL_PARTITIONS.name or ""))
    return [k for k in (partition_key(s, t) for s, t in tables) if k not in have]


def ensure_partitions(instance: dg.DagsterInstance, tables: Sequence[tuple[str, str]]) -> None:
    """Add a partition for every captured table that has none (idempotent)."""
    keys = missing_partitions(instance, tables)
    if keys:
        instance.add_dynamic_partitions(INCREMENTAL_PARTITIONS.name or "", keys)
