"""Tombstone retention in silver (design.md §3, decision 4).

A delete leaves a silver row with ``__deleted = true`` so that an older event of the key,
replayed or arriving late, cannot bring the row back (greatest sequence wins). Replays only
happen within the few windows around a crash, so a tombstone is needed for a bounded time:
:func:`purge_tombstones` removes those whose delete committed (``__source_ts_ms``) before a
cut-off. Readers see no difference (they filter ``NOT __deleted``); the table only shrinks.
The silver table's app transaction (the bronze version it reached) is kept by the commit.
"""

from __future__ import annotations

import pyarrow.compute as pc
from deltalake import DeltaTable

from pgcdc_dagster.cdc.quoting import sql_ident
from pgcdc_dagster.lake.delta import commit_properties, open_table

PURGE_APP_SUFFIX = ":tombstones"


def expired_filter(older_than_ms: int) -> pc.Expression:
    """Tombstones whose delete committed before ``older_than_ms`` (epoch milliseconds)."""
    return pc.field("__deleted") & (pc.field("__source_ts_ms") < older_than_ms)


def count_expired(table: DeltaTable, older_than_ms: int) -> int:
    """Expired tombstones in the table (reads only the two columns the filter needs)."""
    dataset = table.to_pyarrow_dataset()
    return int(dataset.count_rows(filter=expired_filter(older_than_ms)))


def purge_tombstones(uri: str, older_than_ms: int, *, app_id: str) -> int:
    """Delete the silver table's tombstones older than ``older_than_ms``; return how many.

    Nothing is committed when there are none (the common case: no new Delta version each
    day). The delete's commit records ``app_id`` + ``:tombstones`` with the cut-off as its
    version, so the history shows when and up to where tombstones were purged.
    """
    table = open_table(uri)
    if table is None or "__deleted" not in table.schema().to_arrow().names:
        return 0
    if count_expired(table, older_than_ms) == 0:
        return 0
    cutoff = int(older_than_ms)
    metrics = table.delete(
        f"{sql_ident('__deleted')} AND {sql_ident('__source_ts_ms')} < {cutoff}",
        commit_properties=commit_properties(app_id + PURGE_APP_SUFFIX, cutoff,
                                            {"pgcdc.kind": "tombstone_purge",
                                             "pgcdc.older_than_ms": str(cutoff)}))
    return int(metrics.get("num_deleted_rows", 0))
