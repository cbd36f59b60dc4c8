"""Reassemble a window handed out in portions (``peek_window(..., on_portion=...)``)."""

from __future__ import annotations

import dataclasses

from pgcdc_dagster.cdc.changes import TableChanges, Window

COLUMNS = ("op", "commit_lsn", "lsn", "xid", "commit_ts_us", "total_order", "collection_order",
           "before", "before_key_only", "after", "truncate_options")


def merge_portions(portions: list[Window], final: Window) -> Window:
    """One Window as if no portions had been cut: per table, consecutive segments of the same
    relation shape are joined column by column; the metadata is ``final``'s."""
    merged = dataclasses.replace(final, tables={})
    for part in [*portions, final]:
        for key, segments in part.tables.items():
            out = merged.tables.setdefault(key, [])
            for seg in segments:
                if out and out[-1].relation == seg.relation and out[-1].snapshot == seg.snapshot:
                    for name in COLUMNS:
                        getattr(out[-1], name).extend(getattr(seg, name))
                else:
                    copy = TableChanges(seg.relation, snapshot=seg.snapshot)
                    for name in COLUMNS:
                        getattr(copy, name).extend(getattr(seg, name))
                    out.append(copy)
    return merged


def columns(window: Window) -> dict[tuple[str, str], list[dict[str, list[object]]]]:
    """Every segment of every table as ``{column name: values}`` (plus its relation)."""
    return {key: [{"relation": [seg.relation], **{n: list(getattr(seg, n)) for n in COLUMNS}}
                  for seg in segs]
            for key, segs in window.tables.items()}
