"""Reducing bronze events to one row per key, in Arrow (the driver-side silver preparer).

Same contract as ``spark/silver_batch.py``: the event with the greatest sequence
``(__commit_lsn, __ordinal)`` wins per key; events at or before the newest truncate are
dropped; a column the winning event left unchanged (TOAST) takes the newest earlier value of
the same key in the batch when there is one, otherwise it stays listed in
``__toast_unchanged`` so the MERGE keeps the stored value.

A key's life ends at a delete: a value is never taken from before one. An update that
changed the primary key arrives as a delete of the old key and a create of the new key at
the same sequence (``split_key_changes``); under REPLICA IDENTITY DEFAULT the create holds
the unchanged-TOAST placeholder. Its value is the old key's at that point: taken from the
old key's earlier events in the batch, or else looked up in silver (a
:class:`SilverLookup`, resolved by ``lake/silver_lookup.py``); when neither has it, the
placeholder stays and a warning names table, key and column (STR-46..52, IMP-06).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

INPUT_COLUMNS = ("key", "before", "after", "source", "op", "__commit_lsn", "__ordinal",
                 "__toast_unchanged")
"""The bronze columns the preparer reads."""
SOURCE_FIELDS = {"source": ("lsn", "ts_ms")}
"""The fields of the envelope's ``source`` the preparer uses (``__lsn``, ``__source_ts_ms``):
the Arrow path reads only these (``lake/bronze_read.py``)."""
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
    lookups: tuple[SilverLookup, ...] = ()
    """Gaps of moved rows (primary-key changes) whose value is the old key's stored value,
    or that nothing holds (``key`` None)."""


@dataclass(frozen=True, slots=True)
class SilverLookup:
    """A column of a prepared row whose value is the stored value of another key."""

    row: int
    """Index of the row in ``PreparedBatch.rows``."""
    column: str
    old_key: tuple[object, ...] | None
    """Key values (bronze encoding, in key order) of the row to read it from in silver;
    None when no value exists anywhere (the placeholder stays)."""
    before: tuple[int, int]
    """Sequence of the key change: the stored row must be older."""


def _newest_truncate(bronze: pa.Table) -> tuple[int, int] | None:
    trunc = bronze.filter(pc.equal(bronze["op"], "t"))
    if trunc.num_rows == 0:
        return None
    best = max(zip(trunc["__commit_lsn"].to_pylist(), trunc["__ordinal"].to_pylist(),
                   strict=True))
    return int(best[0]), int(best[1])


def _slim(rows: pa.Table) -> pa.Table:
    """The columns the output is built from (``source`` reduced to the two fields used)."""
    source = rows["source"]
    return pa.table({
        "op": rows["op"], "before": rows["before"], "after": rows["after"],
        "__commit_lsn": rows["__commit_lsn"], "__ordinal": rows["__ordinal"],
        "__lsn": pc.struct_field(source, "lsn"), "__source_ts_ms": pc.struct_field(source, "ts_ms"),
        "__toast_unchanged": rows["__toast_unchanged"],
    })


def _output(rows: pa.Table) -> pa.Table:
    """The output columns for (slim) bronze rows (``image``: after, or before for deletes)."""
    if "source" in rows.column_names:
        rows = _slim(rows)
    is_delete = pc.equal(rows["op"], "d")
    before, after = rows["before"].combine_chunks(), rows["after"].combine_chunks()
    image = after if not pc.any(is_delete).as_py() else pc.if_else(is_delete, before, after)
    return pa.table({
        "image": image, "op": rows["op"], "__commit_lsn": rows["__commit_lsn"],
        "__ordinal": rows["__ordinal"], "__lsn": rows["__lsn"],
        "__source_ts_ms": rows["__source_ts_ms"], "__toast_unchanged": rows["__toast_unchanged"],
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
    slim = _slim(rows)
    winners = _output(slim.take(pc.filter(order, last)))
    lookups: tuple[SilverLookup, ...] = ()
    if toastable and pc.any(pc.greater(pc.list_value_length(
            winners["__toast_unchanged"]), 0)).as_py():
        sorted_keys = narrow.select(key_names).take(order)
        winners, lookups = _fill_toast(_output(slim.take(order)), sorted_keys, last, winners,
                                       toastable)
    return PreparedBatch(winners.select(list(OUTPUT_COLUMNS)), truncate_seq, events, lookups)


_FOUND, _BEFORE_BATCH, _NOWHERE = "found", "before", "nowhere"


@dataclass
class _Chains:
    """The sorted batch as Python lists, for walking a key's events backwards."""

    images: list[dict[str, object] | None]
    unchanged: list[list[str] | None]
    ops: list[str]
    seqs: list[tuple[int, int]]
    keys: list[tuple[object, ...]]
    starts: list[int]
    """Index of the first event of each event's key."""
    _deletes: dict[tuple[int, int], list[int]] | None = None

    @classmethod
    def of(cls, work: pa.Table, keys: pa.Table, ends: list[int]) -> _Chains:
        starts: list[int] = []
        prev = 0
        for end in ends:
            starts.extend([prev] * (end - prev + 1))
            prev = end + 1
        key_lists = [keys.column(i).to_pylist() for i in range(keys.num_columns)]
        return cls(work["image"].to_pylist(), work["__toast_unchanged"].to_pylist(),
                   work["op"].to_pylist(),
                   list(zip(work["__commit_lsn"].to_pylist(), work["__ordinal"].to_pylist(),
                            strict=True)),
                   list(zip(*key_lists, strict=True)), starts)

    def partner(self, i: int) -> int | None:
        """The delete of the old key at the sequence of the key change created at ``i``."""
        if self._deletes is None:
            self._deletes = {}
            for j, op in enumerate(self.ops):
                if op == "d":
                    self._deletes.setdefault(self.seqs[j], []).append(j)
        for j in self._deletes.get(self.seqs[i], []):
            if self.keys[j] != self.keys[i]:
                return j
        return None

    def value(self, col: str, i: int, depth: int = 0
              ) -> tuple[str, object, tuple[object, ...] | None, tuple[int, int] | None]:
        """The value of ``col`` just after event ``i`` of a key, walking back its life.

        Returns (kind, value, old key, key-change sequence): ``found`` with the value;
        ``before`` when the value is older than the batch (the stored value of the key
        reached, None at depth 0 where the MERGE keeps the stored value itself); ``nowhere``.
        """
        start = self.starts[i]
        for j in range(i, start - 1, -1):
            gaps = self.unchanged[j] or ()
            if self.ops[j] == "d":
                return _NOWHERE, None, None, None
            if col not in gaps and self.images[j] is not None:
                return _FOUND, self.images[j].get(col), None, None  # type: ignore[union-attr]
            if self.ops[j] in ("c", "r"):  # a create with a gap: a primary-key change
                if j > start and self.ops[j - 1] == "r" and self.images[j - 1] is not None \
                        and col not in (self.unchanged[j - 1] or ()):
                    # An incremental-snapshot read of the new key placed just before the
                    # create (the DBLog TOAST trap, cdc/dblog.py) holds the value.
                    return _FOUND, self.images[j - 1].get(col), None, None  # type: ignore[union-attr]
                p = self.partner(j)
                if p is None or depth > 64 or p == self.starts[p]:
                    if p is not None and p == self.starts[p]:  # old key's life began earlier
                        return _BEFORE_BATCH, None, self.keys[p], self.seqs[j]
                    return _NOWHERE, None, None, None
                kind, value, old, seq = self.value(col, p - 1, depth + 1)
                if kind == _BEFORE_BATCH and old is None:
                    return _BEFORE_BATCH, None, self.keys[p], self.seqs[j]
                return kind, value, old, seq
        return _BEFORE_BATCH, None, None, None


def _fill_toast(work: pa.Table, keys: pa.Table, last: pa.Array, winners: pa.Table,
                toastable: Sequence[str]) -> tuple[pa.Table, tuple[SilverLookup, ...]]:
    """Fill unchanged-TOAST gaps of winning rows from earlier events (see module docstring)."""
    ends = [i for i, flag in enumerate(last.to_pylist()) if flag]
    unchanged = winners["__toast_unchanged"].to_pylist()
    images = winners["image"].to_pylist()
    chains: _Chains | None = None
    new_unchanged: list[list[str] | None] = []
    lookups: list[SilverLookup] = []
    for w, end in enumerate(ends):
        gaps = [c for c in (unchanged[w] or []) if c in toastable]
        if not gaps:
            new_unchanged.append(unchanged[w])
            continue
        if chains is None:
            chains = _Chains.of(work, keys, ends)
        left = list(unchanged[w] or [])
        image = dict(images[w] or {})
        for col in gaps:
            # The winner itself has the gap: a create with it is a key change (walked back
            # through its partner), an update looks at the key's earlier events.
            kind, value, old, seq = chains.value(col, end)
            if kind == _FOUND:
                image[col] = value
                left.remove(col)
            elif kind == _BEFORE_BATCH and old is not None and seq is not None:
                lookups.append(SilverLookup(w, col, old, seq))
            elif kind == _NOWHERE:
                lookups.append(SilverLookup(w, col, None, chains.seqs[end]))
        images[w] = image
        new_unchanged.append(left or None)
    image_type = winners.schema.field("image").type
    winners = winners.set_column(winners.schema.get_field_index("image"), "image",
                                 pa.array(images, image_type))
    return winners.set_column(winners.schema.get_field_index("__toast_unchanged"),
                              "__toast_unchanged",
                              pa.array(new_unchanged, pa.list_(pa.string()))), tuple(lookups)
