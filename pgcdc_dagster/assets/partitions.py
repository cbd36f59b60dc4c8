"""The incremental snapshot's dynamic partitions: one per captured table.

Partitions are added by every bronze run (initial snapshot, micro-batch) and by the signal
sensor, so a backfill can be launched from the UI as soon as capture has run once. The key of
a table is :func:`pgcdc_dagster.names.partition_key` (``schema.table``, quoted as Debezium's
``data-collections`` quote it). Each capture has its own (``CaptureNames.partitions``).
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from pgcdc_dagster.assets.naming import DEFAULT_NAMES, CaptureNames
from pgcdc_dagster.names import partition_key, partition_table

INCREMENTAL_PARTITIONS = DEFAULT_NAMES.partitions
"""The unnamed capture's partitions, ``<schema>.<table>`` (a part holding ``.`` or ``"``
is double-quoted, as in Debezium's ``data-collections``)."""


def missing_partitions(instance: dg.DagsterInstance, tables: Sequence[tuple[str, str]],
                       names: CaptureNames = DEFAULT_NAMES) -> list[str]:
    """The captured tables' partition keys the instance does not have yet."""
    have = set(instance.get_dynamic_partitions(names.partitions.name or ""))
    return [k for k in (partition_key(s, t) for s, t in tables) if k not in have]


def ensure_partitions(instance: dg.DagsterInstance, tables: Sequence[tuple[str, str]],
                      names: CaptureNames = DEFAULT_NAMES) -> None:
    """Add a partition for every captured table that has none (idempotent)."""
    keys = missing_partitions(instance, tables, names)
    if keys:
        instance.add_dynamic_partitions(names.partitions.name or "", keys)


__all__ = ["INCREMENTAL_PARTITIONS", "ensure_partitions", "missing_partitions",
           "partition_key", "partition_table"]
