"""Schema evolution of Delta tables when a Relation message changes a table's shape.

Added columns (also inside the ``before``/``after`` structs) are merged into the table's
schema; old files simply lack them and read as null. A dropped column stays in the schema
(history keeps its values; new rows hold null). A changed type cannot be stored in place
under reader v1 / writer v2, so it is refused with an error naming the column.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

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


def evolve(table: DeltaTable, incoming: pa.Schema, what: str) -> pa.Schema:
    """Merge ``incoming``'s new fields into the table's schema; return the schema to commit.

    Raises:
        SchemaChangeError: a column's type changed.
    """
    current = table.schema().to_arrow()
    current = pa.schema(current) if not isinstance(current, pa.Schema) else current
    bad = list(conflicts(current, incoming))
    if bad:
        raise SchemaChangeError(
            f"{what}: column type changed ({', '.join(bad)}); a Delta table (reader v1 / "
            "writer v2) cannot change a column's type in place. Re-snapshot the table "
            "(drop its bronze and silver tables and run initial_snapshot), or exclude it.")
    if not has_new_fields(current, incoming):
        return current
    write_deltalake(table, incoming.empty_table(), mode="append", schema_mode="merge")
    table.update_incremental()
    merged = table.schema().to_arrow()
    return merged if isinstance(merged, pa.Schema) else pa.schema(merged)
