"""Appending a decoded window to bronze, exactly once per table (design.md §3, decision 3)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import pyarrow as pa

from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.changes import Relation, TableChanges, Window
from pgcdc_dagster.cdc.envelope import SourceIdentity, bronze_from_changes
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.lake.delta import append_arrow, committed_version, ensure_table, open_table


def _keep(seg: TableChanges, skip_below: int) -> TableChanges:
    """The segment without transactions committed at or below an already-written window."""
    if not seg.commit_lsn or seg.commit_lsn[0] >= skip_below:
        return seg
    idx = [i for i, c in enumerate(seg.commit_lsn) if c >= skip_below]
    out = TableChanges(seg.relation)
    for name in ("op", "commit_lsn", "lsn", "xid", "commit_ts_us", "total_order",
                 "collection_order", "before", "before_key_only", "after", "truncate_options"):
        src = getattr(seg, name)
        if src:
            setattr(out, name, [src[i] for i in idx])
    return out


def write_window(window: Window, upto: Lsn, contexts: dict[tuple[str, str], TableContext],
                 converters: Callable[[Relation], Sequence[ColumnConverter]],
                 ident: SourceIdentity) -> dict[str, dict[str, int]]:
    """Append the window's events to bronze, exactly once per table; return counts by op."""
    counts: dict[str, dict[str, int]] = {}
    now_ms = int(time.time() * 1000)
    for key, segments in window.tables.items():
        ctx = contexts.get(key)
        if ctx is None:
            continue  # published but not captured (e.g. FOR ALL TABLES publication)
        done = committed_version(open_table(ctx.bronze_uri), ctx.bronze_app_id)
        tables = []
        for seg in segments:
            if done is not None:
                seg = _keep(seg, done)
            if len(seg):
                tables.append(bronze_from_changes(seg, converters(seg.relation), ident, now_ms))
        if not tables:
            continue
        data = pa.concat_tables(tables, promote_options="permissive")
        ensure_table(ctx.bronze_uri, ctx.bronze_schema)
        append_arrow(ctx.bronze_uri, data, app_id=ctx.bronze_app_id, version=int(upto),
                     metadata={"pgcdc.kind": "stream", "pgcdc.window_end": str(upto)})
        ops: dict[str, int] = {}
        for op in data.column("op").to_pylist():
            ops[op] = ops.get(op, 0) + 1
        counts[ctx.name] = ops
    return counts
