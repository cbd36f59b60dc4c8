"""Debezium change-event envelopes as Arrow: the bronze row layout (EVT- items).

One bronze row per change event: ``key``, ``before``, ``after``, ``source``, ``op``, ``ts_ms``,
``transaction``, plus sortable sequence columns ``__commit_lsn`` / ``__ordinal`` (the order
silver uses) and ``__toast_unchanged`` (columns whose value was unchanged TOAST and is held
by the placeholder, so silver never writes the placeholder over the stored value).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST, Relation, Row, TableChanges
from pgcdc_dagster.cdc.typeconv import ColumnConverter

CONNECTOR_VERSION = "2.3.4.pgcdc"
"""Reported in ``source.version``: the Debezium release whose PostgreSQL event structure the
seeds describe (seed 000 §7.3: ``"version": "2.3.4.Final"``), marked as this project's."""

SOURCE_TYPE = pa.struct([
    pa.field("version", pa.string(), nullable=False),
    pa.field("connector", pa.string(), nullable=False),
    pa.field("name", pa.string(), nullable=False),
    pa.field("ts_ms", pa.int64(), nullable=False),
    pa.field("snapshot", pa.string()),
    pa.field("db", pa.string(), nullable=False),
    pa.field("sequence", pa.string()),
    pa.field("ts_us", pa.int64()),
    pa.field("schema", pa.string(), nullable=False),
    pa.field("table", pa.string(), nullable=False),
    pa.field("txId", pa.int64()),
    pa.field("lsn", pa.int64()),
    pa.field("xmin", pa.int64()),
])

TRANSACTION_TYPE = pa.struct([
    pa.field("id", pa.string()),
    pa.field("total_order", pa.int64()),
    pa.field("data_collection_order", pa.int64()),
])

SEQUENCE_COLUMNS = ("__commit_lsn", "__ordinal")


@dataclass(frozen=True, slots=True)
class SourceIdentity:
    """Connector-level values of every ``source`` block."""

    name: str
    """Debezium ``topic.prefix`` (logical server name)."""
    db: str


def relaxed(field: pa.Field) -> pa.Field:
    """The field with every nested field nullable.

    Bronze stores absent images (``before`` of an insert, the key of a truncate) as null
    structs, whose children are null too; Parquet and Delta refuse nulls in non-nullable
    children, so storage types are nullable throughout. Debezium's ``optional`` flags stay
    in the field metadata (``debezium.schema``).
    """
    typ = field.type
    if pa.types.is_struct(typ):
        typ = pa.struct([relaxed(typ.field(i)) for i in range(typ.num_fields)])
    elif pa.types.is_large_list(typ):
        typ = pa.large_list(relaxed(typ.value_field))
    elif pa.types.is_list(typ):
        typ = pa.list_(relaxed(typ.value_field))
    elif pa.types.is_map(typ):
        typ = pa.map_(typ.key_field, relaxed(typ.item_field))
    return pa.field(field.name, typ, True, metadata=field.metadata)


def value_type(converters: Sequence[ColumnConverter]) -> pa.StructType:
    """The ``<prefix>.<schema>.<table>.Value`` struct: one bronze field per column."""
    return pa.struct([relaxed(c.bronze_field) for c in converters])


def key_type(relation: Relation, converters: Sequence[ColumnConverter]) -> pa.StructType:
    """The ``...Key`` struct: the key columns' bronze fields."""
    return pa.struct([
        relaxed(c.bronze_field)
        for col, c in zip(relation.columns, converters, strict=True) if col.is_key
    ])


def _bronze_values(conv: ColumnConverter, text: pa.Array) -> pa.Array:
    """Convert text values and cast them to the relaxed storage type."""
    out = conv.to_bronze(text)
    target = relaxed(conv.bronze_field).type
    return out if out.type == target else out.cast(target)


def bronze_schema(relation: Relation, converters: Sequence[ColumnConverter]) -> pa.Schema:
    """Arrow schema of a table's bronze change events."""
    value = value_type(converters)
    return pa.schema([
        pa.field("key", key_type(relation, converters)),
        pa.field("before", value),
        pa.field("after", value),
        pa.field("source", SOURCE_TYPE, nullable=False),
        pa.field("op", pa.string()),
        pa.field("ts_ms", pa.int64()),
        pa.field("transaction", TRANSACTION_TYPE),
        pa.field("__commit_lsn", pa.int64(), nullable=False),
        pa.field("__ordinal", pa.int64(), nullable=False),
        pa.field("__toast_unchanged", pa.list_(pa.string())),
    ], metadata={"pgcdc.relation": f"{relation.namespace}.{relation.name}"})


def _text_columns(rows: Sequence[Row | None], width: int
                  ) -> tuple[list[pa.Array], list[np.ndarray | None] | None]:
    """The rows' values as one text array per column, plus unchanged-TOAST flags.

    Vectorised: the row tuples are flattened once (C speed), converted to one Arrow array by
    inference (much faster than an explicit type on Python objects) and cut into columns with
    ``list_element`` over a fixed-size-list view. Absent rows read as nulls. The second item
    holds, per column, a boolean mask of the unchanged-TOAST values (None when there are none).
    """
    n = len(rows)
    empty: Row = (None,) * width
    full: Sequence[Row] = [r if r is not None else empty for r in rows] \
        if rows.count(None) else rows  # type: ignore[assignment]
    flat = list(chain.from_iterable(full))
    if len(flat) != n * width:
        raise ValueError(f"row tuples do not match the relation's {width} columns")
    flags: np.ndarray | None = None
    try:
        arr = pa.array(flat)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        # Only unchanged-TOAST sentinels make inference fail (values are bytes or None).
        flags = np.fromiter((v is UNCHANGED_TOAST for v in flat), dtype=bool, count=len(flat))
        arr = pa.array([None if f else v for v, f in zip(flat, flags.tolist(), strict=True)])
    del flat
    if isinstance(arr, pa.ChunkedArray) or pa.types.is_large_binary(arr.type):
        arr = pa.concat_arrays([c.cast(pa.large_binary()) for c in pa.chunked_array(arr).chunks])
        text = arr.cast(pa.large_string())
    else:
        text = arr.cast(pa.string())  # binary (or null when every value is null)
    view = pa.FixedSizeListArray.from_arrays(text, width)
    columns = [pc.list_element(view, i) for i in range(width)]
    columns = [c if c.type == pa.string() else c.cast(pa.string()) for c in columns]
    if flags is None:
        return columns, None
    grid = flags.reshape(n, width)
    return columns, [grid[:, i] if grid[:, i].any() else None for i in range(width)] \
        if grid.any() else None


def _image(rows: Sequence[Row | None], converters: Sequence[ColumnConverter],
           struct_type: pa.StructType) -> tuple[pa.StructArray, list[list[str]] | None]:
    """Convert row tuples of text values into a struct of bronze values.

    Returns the struct and, when any value was unchanged TOAST, the per-row names of those
    columns (their bronze value is the type's placeholder).
    """
    width = len(converters)
    n = len(rows)
    if rows.count(None) == n:  # e.g. no old images: one null struct column
        return pa.nulls(n, struct_type), None
    if width == 0:
        return pa.StructArray.from_arrays([], fields=[], mask=pa.array(
            [r is None for r in rows], pa.bool_())), None
    texts, toast = _text_columns(rows, width)
    arrays = []
    for idx, (text, conv) in enumerate(zip(texts, converters, strict=True)):
        converted = _bronze_values(conv, text)
        flags = toast[idx] if toast is not None else None
        if flags is not None:
            placeholder = conv.bronze_placeholder()
            if placeholder is None:
                placeholder = pa.scalar(None, converted.type)
            elif placeholder.type != converted.type:
                placeholder = placeholder.cast(converted.type)
            converted = pc.if_else(pa.array(flags, pa.bool_()), placeholder, converted)
        arrays.append(converted)
    unchanged: list[list[str]] | None = None
    if toast is not None:
        names = [conv.bronze_field.name for conv in converters]
        unchanged = [[] for _ in range(n)]
        for idx, flags in enumerate(toast):
            if flags is not None:
                for row_no in np.flatnonzero(flags).tolist():
                    unchanged[row_no].append(names[idx])
    mask = None
    if rows.count(None):
        mask = pa.array([r is None for r in rows], pa.bool_())
    struct = pa.StructArray.from_arrays(arrays, fields=list(struct_type), mask=mask)
    return struct, unchanged


def _key(relation: Relation, image: pa.StructArray, key_struct: pa.StructType) -> pa.StructArray:
    names = [f.name for f in key_struct]
    arrays = [image.field(n) for n in names]
    return pa.StructArray.from_arrays(arrays, fields=list(key_struct), mask=image.is_null())


def fill_unchanged_from_old(seg: TableChanges) -> TableChanges:
    """Unchanged TOAST values of an update taken from its full old row (STR-48, TYPE-17).

    Under REPLICA IDENTITY FULL pgoutput sends the whole old row ('O', its TOAST values
    included), yet marks the new row's unchanged TOAST columns 'u' all the same; the seeds
    (Debezium's documentation) have FULL-identity TOAST columns "in before and after like any
    other column", so ``after`` holds the old row's value, not the placeholder. A key-only old
    tuple ('K') holds NULLs for the other columns, never their values: left alone (as is a
    segment that does not say which kind its old tuples are).
    """
    if len(seg.before_key_only) != len(seg) or seg.before.count(None) == len(seg.before):
        return seg
    after = seg.after
    for i, (op, old, new) in enumerate(zip(seg.op, seg.before, seg.after, strict=True)):
        if op != "u" or old is None or new is None or seg.before_key_only[i] \
                or UNCHANGED_TOAST not in new:
            continue
        if after is seg.after:
            after = list(seg.after)
        after[i] = tuple(o if v is UNCHANGED_TOAST and o is not UNCHANGED_TOAST else v
                         for v, o in zip(new, old, strict=True))
    if after is seg.after:
        return seg
    out = copy.copy(seg)
    out.after = after
    return out


def split_key_changes(seg: TableChanges) -> TableChanges:
    """Turn each update that changed the key into a delete of the old key plus a create.

    Debezium emits a DELETE (old key) and a CREATE (new key) when a primary key changes;
    silver then drops the old key and inserts the new one.
    """
    if seg.before.count(None) == len(seg.before):  # no old tuples: no key can have changed
        return seg
    key_pos = [i for i, c in enumerate(seg.relation.columns) if c.is_key]
    changed = [
        i for i, (op, before) in enumerate(zip(seg.op, seg.before, strict=True))
        if op == "u" and before is not None and seg.after[i] is not None
        and any(before[k] != seg.after[i][k] for k in key_pos)  # type: ignore[index]
    ]
    if not changed:
        return seg
    out = TableChanges(seg.relation, snapshot=seg.snapshot)
    lists = ("commit_lsn", "lsn", "xid", "commit_ts_us", "total_order", "collection_order",
             "truncate_options")
    changed_set = set(changed)
    for i in range(len(seg)):
        copies = [("d", seg.before[i], None), ("c", None, seg.after[i])] if i in changed_set \
            else [(seg.op[i], seg.before[i], seg.after[i])]
        for op, before, after in copies:
            out.op.append(op)
            out.before.append(before)
            out.before_key_only.append(seg.before_key_only[i] if seg.before_key_only else False)
            out.after.append(after)
            for name in lists:
                src = getattr(seg, name)
                if src:
                    getattr(out, name).append(src[i])
    return out


def _const(value: object, n: int, typ: pa.DataType | None = None) -> pa.Array:
    """A column repeating one value (cheap: no Python list of n items)."""
    return pa.repeat(pa.scalar(value, typ), n)


def _floor_ms(us: pa.Array) -> pa.Array:
    """Microseconds to milliseconds, rounding down like Java's floorDiv (also before 1970)."""
    return pc.divide(pc.subtract(us, pc.if_else(pc.less(us, 0), 999, 0)), 1000)


def sequence_text(commit_lsn: int | None, lsn: int) -> str:
    """``source.sequence`` of one event as Debezium's Jackson writes it: ``[null,"<lsn>"]``
    (no space after the comma; seed 000 shows ``"[\\"24023119\\",\\"24023128\\"]"``)."""
    return json.dumps([None if commit_lsn is None else str(commit_lsn), str(lsn)],
                      separators=(",", ":"))


def _sequence_strings(commit_lsn: pa.Array, lsn: pa.Array) -> pa.Array:
    """``source.sequence``: the JSON array ``["<commit lsn>","<lsn>"]`` per event."""
    return pc.binary_join_element_wise(
        "[\"", pc.cast(commit_lsn, pa.string()), "\",\"", pc.cast(lsn, pa.string()), "\"]",
        "")


def bronze_from_changes(seg: TableChanges, converters: Sequence[ColumnConverter],
                        ident: SourceIdentity, processed_ms: int, *,
                        tombstones: bool = False) -> pa.Table:
    """Bronze rows for one stream segment (ops c/u/d/t), in the segment's order.

    A segment with ``snapshot`` set holds snapshot rows (``op = r``) placed in the stream by
    their sequence (incremental-snapshot chunks); ``source.snapshot`` is that marker.

    With ``tombstones`` (Debezium ``tombstones.on.delete``) every delete is followed by a
    tombstone row: the same key, ``op``, ``before`` and ``after`` null (STR-70).
    """
    seg = split_key_changes(fill_unchanged_from_old(seg))
    relation = seg.relation
    schema = bronze_schema(relation, converters)
    value = value_type(converters)
    n = len(seg)
    before, _ = _image(seg.before, converters, value)
    after, unchanged = _image(seg.after, converters, value)
    key_struct = key_type(relation, converters)
    key_after = _key(relation, after, key_struct)
    key_before = _key(relation, before, key_struct)
    key = pc.if_else(pc.is_null(key_after), key_before, key_after)
    commit_lsn = pa.array(seg.commit_lsn, pa.int64())
    change_lsn = pa.array(seg.lsn, pa.int64())
    xid = pa.array(seg.xid, pa.int64())
    ts_us = pa.array(seg.commit_ts_us, pa.int64())
    total_order = pa.array(seg.total_order, pa.int64())
    source = pa.StructArray.from_arrays([
        _const(CONNECTOR_VERSION, n, pa.string()), _const("postgresql", n, pa.string()),
        _const(ident.name, n, pa.string()), _floor_ms(ts_us),
        _const(seg.snapshot or "false", n, pa.string()), _const(ident.db, n, pa.string()),
        _sequence_strings(commit_lsn, change_lsn), ts_us,
        _const(relation.namespace, n, pa.string()), _const(relation.name, n, pa.string()),
        xid, change_lsn, pa.nulls(n, pa.int64()),
    ], fields=list(SOURCE_TYPE))
    transaction = pa.StructArray.from_arrays([
        pc.binary_join_element_wise(pc.cast(xid, pa.string()), pc.cast(commit_lsn, pa.string()),
                                    ":"),
        total_order, pa.array(seg.collection_order, pa.int64()),
    ], fields=list(TRANSACTION_TYPE))
    table = pa.Table.from_arrays([
        key, before, after, source, pa.array(seg.op, pa.string()),
        _const(processed_ms, n, pa.int64()), transaction, commit_lsn, total_order,
        pa.array(unchanged, pa.list_(pa.string())) if unchanged is not None
        else pa.nulls(n, pa.list_(pa.string())),
    ], schema=schema)
    return with_tombstones(table) if tombstones and "d" in seg.op else table


def with_tombstones(table: pa.Table) -> pa.Table:
    """Insert a tombstone row (op, before, after null) right after each delete."""
    ops = table.column("op").to_pylist()
    order: list[int] = []
    tomb: list[bool] = []
    for i, op in enumerate(ops):
        order.append(i)
        tomb.append(False)
        if op == "d":
            order.append(i)
            tomb.append(True)
    out = table.take(pa.array(order, pa.int64()))
    mask = pa.array(tomb)
    for name in ("op", "before", "after"):
        idx = out.schema.get_field_index(name)
        col = out.column(idx).combine_chunks()
        out = out.set_column(idx, out.schema.field(idx),
                             pc.if_else(mask, pa.scalar(None, col.type), col))
    return out


def bronze_from_snapshot(relation: Relation, converters: Sequence[ColumnConverter],
                         text: pa.RecordBatch, ident: SourceIdentity, *, lsn: int,
                         snapshot: str, processed_ms: int) -> pa.Table:
    """Bronze ``op = r`` rows for a batch of snapshot rows (every column as text).

    ``lsn`` is the snapshot's position (the slot's consistent point, or the high watermark
    of an incremental-snapshot chunk); it is the rows' commit LSN, with ordinal 0 so any
    streamed change at the same position sorts after them.
    """
    schema = bronze_schema(relation, converters)
    n = text.num_rows
    arrays = [_bronze_values(conv, text.column(i)) for i, conv in enumerate(converters)]
    after = pa.StructArray.from_arrays(arrays, fields=list(value_type(converters)))
    key = _key(relation, after, key_type(relation, converters))
    source = pa.StructArray.from_arrays([
        _const(CONNECTOR_VERSION, n, pa.string()), _const("postgresql", n, pa.string()),
        _const(ident.name, n, pa.string()), _const(processed_ms, n, pa.int64()),
        _const(snapshot, n, pa.string()), _const(ident.db, n, pa.string()),
        _const(sequence_text(None, lsn), n, pa.string()),
        _const(processed_ms * 1000, n, pa.int64()),
        _const(relation.namespace, n, pa.string()), _const(relation.name, n, pa.string()),
        pa.nulls(n, pa.int64()), _const(lsn, n, pa.int64()), pa.nulls(n, pa.int64()),
    ], fields=list(SOURCE_TYPE))
    return pa.Table.from_arrays([
        key, pa.nulls(n, schema.field("before").type), after, source,
        _const("r", n, pa.string()), _const(processed_ms, n, pa.int64()),
        pa.nulls(n, TRANSACTION_TYPE), _const(lsn, n, pa.int64()),
        _const(0, n, pa.int64()), pa.nulls(n, pa.list_(pa.string())),
    ], schema=schema)
