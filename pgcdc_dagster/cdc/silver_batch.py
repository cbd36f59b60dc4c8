"""Reducing bronze events to one row per key, in Arrow (the driver-side silver preparer).

Same contract as ``spark/silver_batch.py``: the event with the greatest sequence
``(__commit_lsn, __ordinal)`` wins per key; events at or before the newest truncate are
dropped; a column the winning event left unchanged (TOAST) takes the newest earlier value of
the same key in the batch when there is one, otherwise it stays listed in
``__toast_unchanged`` so the MERGE keeps the stored value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

OUTPUT_COLUMNS = ("image", "op", "__commit_lsn", "__ordinal", "__lsn", "__source_ts_ms",
                  "__toast_unchanged")


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """The deduplicated batch and the newest truncate in it."""

    rows: pa.Table
    """Columns: ``image`` (struct of bronze values: after, or before for deletes), ``op``,
    ``__commit_lsn``, ``__ordinal``, ``__lsn``, ``__source_ts_ms``, ``__toast_unchanged``."""
    truncate_seq: tuple[int, int] | None
    events: int


def _newest_truncate(bronze: pa.Table) -> tuple[int, int] | None:
    trunc = bronze.filter(pc.equal(bronze["op"], "t"))
    if trunc.num_rows == 0:
        return None
    best = max(zip(trunc["__commit_lsn"].to_pylist(), trunc["__ordinal"].to_pylist(),
                   strict=True))
    return int(best[0]), int(best[1])


def _output(rows: pa.Table) -> pa.Table:
    """The output columns for bronze rows (``image``: after, or before for deletes)."""
    is_delete = pc.equal(rows["op"], "d")
    before, after = rows["before"].combine_chunks(), rows["after"].combine_chunks()
    image = after if not pc.any(is_delete).as_py() else pc.if_else(is_delete, before, after)
    source = rows["source"].combine_chunks()
    return pa.table({
        "image": image, "op": rows["op"], "__commit_lsn": rows["__commit_lsn"],
        "__ordinal": rows["__ordinal"], "__lsn": pc.struct_field(source, "lsn"),
        "__source_ts_ms": pc.struct_field(source, "ts_ms"),
        "__toast_unchanged": rows["__toast_unchanged"],
    })


def prepare_arrow(bronze: pa.Table, key_columns: Sequence[str],
                  toastable: Sequence[str]) -> PreparedBatch:
    """Reduce a table of bronze rows (see module docstring).

    Only the keys and the sequence are sorted; the wide columns (images, source) are taken
    for the winning rows alone.
    """
    events = bronze.num_rows
    truncate_seq = _newest_truncate(bronze)
    keep = pc.is_in(bronze["op"], pa.array(["c", "u", "d", "r"]))
    if truncate_seq is not None:
        lsn, ordinal = truncate_seq
        newer = pc.or_(pc.greater(bronze["__commit_lsn"], lsn),
                       pc.and_(pc.equal(bronze["__commit_lsn"], lsn),
                               pc.greater(bronze["__ordinal"], ordinal)))
        keep = pc.and_(keep, newer)
    rows = bronze if pc.all(keep).as_py() else bronze.filter(keep)
    n = rows.num_rows
    if n == 0:
        return PreparedBatch(_output(rows).select(list(OUTPUT_COLUMNS)), truncate_seq, events)
    key = rows["key"].combine_chunks()
    key_names = [f"__k{i}" for i in range(len(key_columns))]
    narrow = pa.table({
        **{name: pc.struct_field(key, k) for name, k in zip(key_names, key_columns, strict=True)},
        "__commit_lsn": rows["__commit_lsn"], "__ordinal": rows["__ordinal"],
    })
    order = pc.sort_indices(narrow, sort_keys=[(k, "ascending") for k in key_names]
                            + [("__commit_lsn", "ascending"), ("__ordinal", "ascending")])
    if n == 1:
        last = pa.array([True])
    else:
        differs = None
        for k in key_names:
            col = narrow[k].combine_chunks().take(order)
            a, b = col.slice(0, n - 1), col.slice(1)
            d = pc.not_equal(a, b)
            if col.null_count:  # null equals null here: one group
                d = pc.if_else(pc.and_(pc.is_null(a), pc.is_null(b)), False,
                               pc.fill_null(d, True))
            differs = d if differs is None else pc.or_(differs, d)
        assert differs is not None
        last = pa.concat_arrays([differs, pa.array([True])])
    winners = _output(rows.take(pc.filter(order, last)))
    if toastable and pc.any(pc.greater(pc.list_value_length(
            winners["__toast_unchanged"]), 0)).as_py():
        winners = _fill_toast(_output(rows.take(order)), last, winners, key_names, toastable)
    return PreparedBatch(winners.select(list(OUTPUT_COLUMNS)), truncate_seq, events)


def _fill_toast(work: pa.Table, last: pa.Array, winners: pa.Table, key_names: list[str],
                toastable: Sequence[str]) -> pa.Table:
    """Fill unchanged-TOAST gaps of winning rows from earlier events of the same key."""
    ends = [i for i, flag in enumerate(last.to_pylist()) if flag]
    unchanged = winners["__toast_unchanged"].to_pylist()
    images = winners["image"].to_pylist()
    all_images: list[dict[str, object] | None] | None = None
    all_unchanged: list[list[str] | None] | None = None
    ops: list[str] | None = None
    new_unchanged: list[list[str] | None] = []
    for w, end in enumerate(ends):
        gaps = [c for c in (unchanged[w] or []) if c in toastable]
        if not gaps:
            new_unchanged.append(unchanged[w])
            continue
        if all_images is None:
            all_images = work["image"].to_pylist()
            all_unchanged = work["__toast_unchanged"].to_pylist()
            ops = work["op"].to_pylist()
        assert all_unchanged is not None and ops is not None
        start = ends[w - 1] + 1 if w else 0
        left = list(unchanged[w] or [])
        image = dict(images[w] or {})
        for col in gaps:
            for i in range(end - 1, start - 1, -1):
                earlier = all_images[i]
                if ops[i] != "d" and earlier is not None and col not in (all_unchanged[i] or []):
                    image[col] = earlier.get(col)
                    left.remove(col)
                    break
        images[w] = image
        new_unchanged.append(left or None)
    del key_names
    image_type = winners.schema.field("image").type
    winners = winners.set_column(winners.schema.get_field_index("image"), "image",
                                 pa.array(images, image_type))
    return winners.set_column(winners.schema.get_field_index("__toast_unchanged"),
                              "__toast_unchanged",
                              pa.array(new_unchanged, pa.list_(pa.string())))
