"""Schema evolution of Delta tables when a Relation message changes a table's shape.

Added columns (also inside the ``before``/``after`` structs) are merged into the table's
schema; old files simply lack them and read as null. A dropped column stays in the schema
(history keeps its values; new rows hold null). Field metadata of existing fields is kept as
the table has it (a column's ``debezium.schema`` legitimately changes with ``SET NOT NULL``
or a column mapper; the schema history, ``lake/schema_history.py``, keeps every version).

Bronze never changes a field's type: a column whose encoding changes is stored in a new,
versioned field (``cdc/column_versions.py``), so a type conflict reaching :func:`evolve` on
bronze is a bug and is refused. Silver is derived current state: with ``cast_changed`` a
changed column type rewrites silver once, every stored value cast to the new type through the
silver types of the column's intermediate versions (refused, with the fix, when a value does
not cast exactly).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from pgcdc_dagster.cdc.column_versions import cast_through, silver_chain
from pgcdc_dagster.exceptions import PgCdcError


class SchemaChangeError(PgCdcError):
    """A column changed type in a way the Delta table cannot store without a rewrite."""


def _nested(typ: pa.DataType) -> pa.StructType | None:
    return typ if pa.types.is_struct(typ) else None


def conflicts(current: pa.Schema | pa.StructType, incoming: pa.Schema | pa.StructType,
              path: str = "") -> Iterator[str]:
    """Paths of fields present in both whose types differ (nullability ignored)."""
    have = {f.name: f for f in current}
    for field in incoming:
        old = have.get(field.name)
        if old is None:
            continue
        name = f"{path}{field.name}"
        a, b = _nested(old.type), _nested(field.type)
        if a is not None and b is not None:
            yield from conflicts(a, b, name + ".")
        elif not _same(old.type, field.type):
            yield f"{name} ({old.type} -> {field.type})"


def _same(a: pa.DataType, b: pa.DataType) -> bool:
    if pa.types.is_list(a) and pa.types.is_list(b):
        return _same(a.value_type, b.value_type)
    if pa.types.is_large_list(a) and pa.types.is_large_list(b):
        return _same(a.value_type, b.value_type)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return all(_same(a.field(f.name).type, f.type) if a.get_field_index(f.name) >= 0
                   else True for f in b)
    if pa.types.is_map(a) and pa.types.is_map(b):
        return _same(a.key_type, b.key_type) and _same(a.item_type, b.item_type)
    return bool(a == b)


def has_new_fields(current: pa.Schema | pa.StructType,
                   incoming: pa.Schema | pa.StructType) -> bool:
    """True when ``incoming`` has a field (at any struct depth) that ``current`` lacks."""
    have = {f.name: f for f in current}
    for field in incoming:
        old = have.get(field.name)
        if old is None:
            return True
        a, b = _nested(old.type), _nested(field.type)
        if a is not None and b is not None and has_new_fields(a, b):
            return True
    return False


def merged_fields(current: pa.Schema | pa.StructType,
                  incoming: pa.Schema | pa.StructType) -> list[pa.Field]:
    """``current``'s fields (their metadata kept) followed by ``incoming``'s new ones, at
    every struct depth."""
    by_name = {f.name: f for f in incoming}
    out = []
    for field in current:
        new = by_name.get(field.name)
        a, b = _nested(field.type), _nested(new.type) if new is not None else None
        if a is not None and b is not None and has_new_fields(a, b):
            field = field.with_type(pa.struct(merged_fields(a, b)))
        out.append(field)
    have = {f.name for f in current}
    out.extend(f for f in incoming if f.name not in have)
    return out


def _as_schema(table: DeltaTable) -> pa.Schema:
    current = table.schema().to_arrow()
    return current if isinstance(current, pa.Schema) else pa.schema(current)


def evolve(table: DeltaTable, incoming: pa.Schema, what: str, *,
           cast_changed: bool = False) -> pa.Schema:
    """Merge ``incoming``'s new fields into the table's schema; return the schema to commit.

    With ``cast_changed`` (silver), a column whose type differs is rewritten to the incoming
    type (:func:`rewrite_cast`) instead of refused.

    Raises:
        SchemaChangeError: a column's type changed (bronze), or a stored value does not
            cast to the new type (silver).
    """
    current = _as_schema(table)
    bad = list(conflicts(current, incoming))
    if bad and cast_changed:
        rewrite_cast(table, incoming, what)
        current = _as_schema(table)
        bad = []
    if bad:
        raise SchemaChangeError(
            f"{what}: column type changed ({', '.join(bad)}); a Delta table (reader v1 / "
            "writer v2) cannot change a column's type in place. Re-snapshot the table "
            "(drop its bronze and silver tables and run initial_snapshot), or exclude it.")
    if not has_new_fields(current, incoming):
        return current
    merged = pa.schema(merged_fields(current, incoming), metadata=current.metadata)
    write_deltalake(table, merged.empty_table(), mode="append", schema_mode="merge")
    table.update_incremental()
    return _as_schema(table)


def with_table_metadata(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with each field's metadata replaced by the table's field of the same name.

    A MERGE with schema merging refuses differing field metadata, which legitimately changes
    (``varchar(10)`` to ``varchar(30)`` changes ``pg.typmod``); the table keeps its own.
    """
    fields = []
    changed = False
    for field in rows.schema:
        idx = schema.get_field_index(field.name)
        if idx >= 0 and (schema.field(idx).metadata or {}) != (field.metadata or {}):
            field = field.with_metadata(schema.field(idx).metadata or {})
            changed = True
        fields.append(field)
    if not changed:
        return rows
    return rows.cast(pa.schema(fields, metadata=rows.schema.metadata))


def rewrite_cast(table: DeltaTable, incoming: pa.Schema, what: str) -> None:
    """Rewrite a (derived) table with the changed columns cast to ``incoming``'s types.

    Batches stream from the current files into the new ones (bounded memory); the overwrite
    commit replaces the files at once. Columns ``incoming`` lacks keep their type; new
    columns are added as nulls.
    """
    current = _as_schema(table)
    changed = {f.name: f for f in incoming if current.get_field_index(f.name) >= 0}
    fields = [changed[f.name] if f.name in changed and not _same(f.type, changed[f.name].type)
              else f for f in current]
    have = {f.name for f in current}
    fields.extend(f for f in incoming if f.name not in have)
    target = pa.schema(fields, metadata=current.metadata)

    # The file list is read now: the writer below must not call back into delta-rs.
    dataset = table.to_pyarrow_dataset()

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in dataset.to_batches():
            columns = []
            for field in target:
                idx = batch.schema.get_field_index(field.name)
                if idx < 0:
                    columns.append(pa.nulls(batch.num_rows, field.type))
                    continue
                column = batch.column(idx)
                try:
                    columns.append(column if column.type == field.type
                                   else cast_through(column, silver_chain(field)))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    failed.append(exc)
                    raise SchemaChangeError(
                        f"{what}: column {field.name} changed type to {field.type} and a "
                        f"stored value does not convert ({exc}). Re-snapshot the table "
                        "(snapshot.mode = always) to rebuild its silver.") from exc
            yield pa.RecordBatch.from_arrays(columns, schema=target)

    failed: list[Exception] = []
    reader = pa.RecordBatchReader.from_batches(target, batches())
    try:
        write_deltalake(table, reader, mode="overwrite", schema_mode="overwrite")
    except Exception as exc:
        if not failed:
            raise
        # delta-rs wraps the reader's error: give the caller ours.
        raise SchemaChangeError(
            f"{what}: a column changed type and a stored value does not convert "
            f"({failed[0]}). Re-snapshot the table (snapshot.mode = always) to rebuild its "
            "silver.") from exc
    table.update_incremental()
