"""Silver: current state per key, merged order-independently (design.md §3, decision 4).

Silver holds the source columns in native types plus ``__op``, ``__lsn`` (Debezium
``source.lsn``), ``__commit_lsn`` and ``__ordinal`` (the sequence: greatest wins),
``__source_ts_ms`` and ``__deleted``. A delete leaves a tombstone row (``__deleted = true``,
the key and whatever the old image held) so that a replayed older event cannot resurrect the
key; tombstones older than the retention are purged by the silver_maintenance job
(``lake/tombstones.py``). Read live rows with ``WHERE NOT __deleted``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.column_versions import silver_values
from pgcdc_dagster.cdc.quoting import sql_column, sql_ident, sql_literal
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.lake.delta import (
    commit_files,
    commit_properties,
    ensure_table,
    load_table,
    write_part,
)
from pgcdc_dagster.lake.evolution import evolve, with_table_metadata

META_FIELDS = (
    pa.field("__op", pa.string(), nullable=False),
    pa.field("__lsn", pa.int64()),
    pa.field("__commit_lsn", pa.int64(), nullable=False),
    pa.field("__ordinal", pa.int64(), nullable=False),
    pa.field("__source_ts_ms", pa.int64()),
    pa.field("__deleted", pa.bool_(), nullable=False),
)
META_NAMES = tuple(f.name for f in META_FIELDS)
TOAST_UNCHANGED = "__toast_unchanged"
"""The MERGE source's column listing, per row, the columns whose stored value is kept."""
RESERVED_NAMES = (*META_NAMES, TOAST_UNCHANGED)
"""Names a source column cannot have in silver (see :func:`reserved_columns`)."""
_S_LSN, _T_LSN = sql_column("s", "__commit_lsn"), sql_column("t", "__commit_lsn")
_S_ORD, _T_ORD = sql_column("s", "__ordinal"), sql_column("t", "__ordinal")
_SEQ_NEWER = f"({_S_LSN} > {_T_LSN}) OR ({_S_LSN} = {_T_LSN} AND {_S_ORD} > {_T_ORD})"


def silver_schema(relation: Relation, converters: Sequence[ColumnConverter]) -> pa.Schema:
    """Arrow schema of a silver table: native source columns, then metadata columns.

    A key column is NOT NULL when its source column is (every primary key); a nullable
    ``message.key.columns`` column stays nullable, and NULL is then one key value.
    """
    fields = [c.silver_field.with_nullable(c.silver_field.nullable or not col.is_key)
              for col, c in zip(relation.columns, converters, strict=True)]
    return pa.schema([*fields, *META_FIELDS])


def toastable_columns(relation: Relation, converters: Sequence[ColumnConverter]) -> list[str]:
    """Columns whose values can be stored out of line (variable-length, non-key)."""
    out = []
    for col, conv in zip(relation.columns, converters, strict=True):
        typ = conv.bronze_field.type
        fixed = pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ)
        if not col.is_key and not fixed:
            out.append(conv.bronze_field.name)
    return out


def silver_from_images(image: pa.StructArray, op: pa.Array, meta: dict[str, pa.Array],
                       relation: Relation, converters: Sequence[ColumnConverter]) -> pa.Table:
    """Silver rows from bronze images (after, or before for deletes) and event metadata."""
    schema = silver_schema(relation, converters)
    children = dict(zip([f.name for f in image.type], image.flatten(), strict=True))
    n = len(image)
    # Each event's value from the bronze field it was written to (a column whose type
    # changed has versioned fields, cdc/column_versions.py); null for a column added later.
    columns = [silver_values(conv, children, n) for conv in converters]
    deleted = pc.equal(op, "d")
    return pa.Table.from_arrays([
        *columns, op, meta["__lsn"], meta["__commit_lsn"], meta["__ordinal"],
        meta["__source_ts_ms"], deleted,
    ], schema=schema)


def merge_batch(uri: str, rows: pa.Table, toast_unchanged: pa.Array, *, relation: Relation,
                toastable: Sequence[str], app_id: str, version: int,
                truncate_seq: tuple[int, int] | None,
                metadata: dict[str, str] | None = None) -> dict[str, int]:
    """Apply one deduplicated batch to silver; record ``(app_id, version)`` in the last commit.

    A truncate in the batch first removes every row older than it. Then a MERGE updates a
    row only when the incoming sequence is greater (replays are harmless), keeps the stored
    value of columns listed in ``__toast_unchanged``, and inserts new keys.
    """
    table = ensure_table(uri, rows.schema)
    # A changed column type rewrites silver once; changed field metadata keeps the table's.
    rows = with_table_metadata(rows, evolve(table, rows.schema, f"silver {uri}",
                                            cast_changed=True))
    counts = {"deleted_by_truncate": 0, "inserted": 0, "updated": 0}
    props = commit_properties(app_id, version, metadata)
    if truncate_seq is not None:
        lsn, ordinal = truncate_seq
        lsn_col, ord_col = sql_ident("__commit_lsn"), sql_ident("__ordinal")
        result = table.delete(
            predicate=(f"{lsn_col} < {int(lsn)} OR "
                       f"({lsn_col} = {int(lsn)} AND {ord_col} < {int(ordinal)})"),
            commit_properties=props if rows.num_rows == 0 else None,
        )
        counts["deleted_by_truncate"] = int(result.get("num_deleted_rows", 0))
        if rows.num_rows == 0:
            return counts
    if rows.num_rows == 0:
        table.create_write_transaction([], "append", rows.schema, commit_properties=props)
        return counts
    keys = relation.key_names
    table.update_incremental()
    stored = pa.schema(table.schema().to_arrow())
    relaxed = [k for k in keys if rows.schema.field(k).nullable
               and stored.get_field_index(k) >= 0 and not stored.field(k).nullable]
    if relaxed:
        # The key column became nullable at the source (DROP NOT NULL), or the table was
        # written when silver declared every key NOT NULL.
        for k in relaxed:
            table.alter.drop_column_not_null(k)
        table.update_incremental()
        stored = pa.schema(table.schema().to_arrow())
    if stored.names == rows.schema.names and _new_keys_only(table, rows, keys):
        # Every key is new (insert-heavy tables with growing keys): the MERGE would insert
        # every row; an append does the same without joining against the stored rows.
        part = write_part(uri, rows.cast(stored), "part-silver")
        commit_files(table, [part], stored, mode="append", app_id=app_id, version=version,
                     metadata=metadata)
        counts["inserted"] = rows.num_rows
        return counts
    source = rows.append_column(TOAST_UNCHANGED, toast_unchanged)
    predicate = key_predicate(keys, [rows.schema.field(k).nullable for k in keys])
    updates = merge_updates(rows.column_names, toastable)
    inserts = {sql_ident(n): sql_column("s", n) for n in rows.column_names}
    result = (
        table.merge(source, predicate=predicate, source_alias="s", target_alias="t",
                    merge_schema=True, commit_properties=props)
        .when_matched_update(updates=updates, predicate=_SEQ_NEWER)
        .when_not_matched_insert(updates=inserts)
        .execute()
    )
    counts["inserted"] = int(result.get("num_target_rows_inserted", 0))
    counts["updated"] = int(result.get("num_target_rows_updated", 0))
    return counts


def key_predicate(keys: Sequence[str], nullable: Sequence[bool]) -> str:
    """The MERGE's key match: ``=`` when every key column is NOT NULL (a hash join on them).

    With a nullable key column, NULL equals NULL (a NULL-keyed row is one key, as under a
    unique index ``NULLS NOT DISTINCT``): every key column is then matched with ``IS NOT
    DISTINCT FROM``, which DataFusion also hashes (null-equal keys). Mixing it with ``=``
    would hash on the ``=`` columns alone and filter the rest, quadratic when those are few
    distinct values. Each term is parenthesized: delta-rs parses ``a IS NOT DISTINCT FROM b
    AND c`` as ``a IS NOT DISTINCT FROM (b AND c)``.
    """
    if not any(nullable):
        return " AND ".join(f"{sql_column('t', k)} = {sql_column('s', k)}" for k in keys)
    return " AND ".join(f"({sql_column('t', k)} IS NOT DISTINCT FROM {sql_column('s', k)})"
                        for k in keys)


def merge_updates(columns: Sequence[str], toastable: Sequence[str]) -> dict[str, str]:
    """The MERGE's update expressions: the source's value, or for a TOAST-able column the
    stored one when the row lists the column in ``__toast_unchanged``.

    Every name is a quoted identifier, and the list membership test compares with a string
    literal: a column name is never read as SQL (issue 18 item 3).
    """
    toast = set(toastable)
    unchanged = sql_column("s", TOAST_UNCHANGED)
    updates = {}
    for name in columns:
        if name in toast:
            updates[sql_ident(name)] = (
                f"CASE WHEN array_has({unchanged}, {sql_literal(name)}) "
                f"THEN {sql_column('t', name)} ELSE {sql_column('s', name)} END")
        else:
            updates[sql_ident(name)] = sql_column("s", name)
    return updates


def _new_keys_only(table: DeltaTable, rows: pa.Table, keys: Sequence[str]) -> bool:
    """True when no stored row (tombstones included) can hold a key of ``rows``.

    Decided from the files' statistics alone, for a single integer key: the batch's key
    range overlaps no file's range. Anything else (composite or non-integer keys, a NULL key
    in the batch, files without statistics or whose keys are all NULL) answers False, and
    the MERGE decides. A stored NULL key cannot hold a batch key that is not NULL, so the
    (NULL-ignoring) min/max statistics suffice.
    """
    if len(keys) != 1 or rows.num_rows == 0:
        return False
    key = rows[keys[0]]
    if not pa.types.is_integer(key.type) or key.null_count:
        return False
    bounds = pc.min_max(key)
    lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return True
    low, high = f"min.{keys[0]}", f"max.{keys[0]}"
    if low not in actions.column_names or high not in actions.column_names:
        return False
    for a, b, n in zip(actions[low].to_pylist(), actions[high].to_pylist(),
                       actions["num_records"].to_pylist(), strict=True):
        if n == 0:
            continue
        if a is None or b is None or not (b < lo or a > hi):
            return False
    return True


def live_rows(uri: str) -> pa.Table:
    """The silver table without tombstones and metadata columns (the analyst's view)."""
    table = load_table(uri).to_pyarrow_table()
    live = table.filter(pc.invert(table["__deleted"]))
    return live.drop_columns(list(META_NAMES))
