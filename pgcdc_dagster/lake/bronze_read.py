"""Reading bronze part files back as one Arrow table under the table's current schema.

Files written before a schema change lack fields added later (also inside the before/after
structs); :func:`conform` fills them with nulls so every file reads under one schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from pgcdc_dagster.lake.delta import load_table
from pgcdc_dagster.lake.storage import filesystem


def conform(data: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array:
    """``data`` as ``target``: missing struct fields become null, others are cast."""
    if isinstance(data, pa.ChunkedArray):
        data = data.combine_chunks()
    if data.type == target:
        return data
    if pa.types.is_struct(target) and pa.types.is_struct(data.type):
        names = {data.type.field(i).name for i in range(data.type.num_fields)}
        children = [
            conform(pa.StructArray.field(data, f.name), f.type) if f.name in names
            else pa.nulls(len(data), f.type)
            for f in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=data.is_null())
    return data.cast(target)


def conform_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """The table under ``schema`` (columns in schema order, missing ones null)."""
    columns = [
        (table[f.name] if table.schema.field(f.name).type == f.type
         else conform(table[f.name], f.type)) if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def read_files(files: Sequence[str], schema: pa.Schema,
               columns: Sequence[str] | None = None,
               subfields: Mapping[str, Sequence[str]] | None = None) -> pa.Table:
    """Read Parquet files (local paths or URIs) into one table conformed to ``schema``.

    ``columns`` (top-level names) restricts what is read and returned; ``subfields`` reads
    only the named fields of a struct column (``{"source": ("lsn", "ts_ms")}``: the other
    fields of the envelope's ``source`` are half of a bronze file's decoded size), which is
    returned as a struct of those fields alone.
    """
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
    narrow = dict(subfields or {})
    if narrow:
        schema = pa.schema([_narrowed(f, narrow[f.name]) if f.name in narrow else f
                            for f in schema], metadata=schema.metadata)
    parts = []
    for path in files:
        fs, inner = filesystem(path)
        with fs.open_input_file(inner) as handle:
            parquet = pq.ParquetFile(handle)
            parts.append(conform_table(
                parquet.read(columns=_read_paths(parquet.schema_arrow, schema, narrow)),
                schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _narrowed(field: pa.Field, names: Sequence[str]) -> pa.Field:
    """A struct field reduced to the named children (in that order)."""
    struct = field.type
    if not pa.types.is_struct(struct):
        raise ValueError(f"{field.name} is not a struct column: its fields cannot be selected")
    return field.with_type(pa.struct([struct.field(n) for n in names]))


def _read_paths(stored: pa.Schema, wanted: pa.Schema,
                narrow: Mapping[str, Sequence[str]]) -> list[str]:
    """Column paths of ``wanted`` that a file (``stored``) has: top-level names, and
    ``name.child`` for the narrowed structs (top-level names of bronze hold no dots)."""
    paths: list[str] = []
    for f in wanted:
        if f.name not in stored.names:
            continue  # a column added after the file was written: conform_table fills nulls
        if f.name not in narrow:
            paths.append(f.name)
            continue
        have = stored.field(f.name).type
        paths += [f"{f.name}.{n}" for n in narrow[f.name]
                  if pa.types.is_struct(have) and have.get_field_index(n) >= 0]
    return paths


def count_rows(uri: str, files: Sequence[str]) -> int:
    """Rows in the given data files, from the Delta log's statistics (no data read)."""
    wanted = {f.rsplit("/", 1)[-1] for f in files}
    actions = pa.table(load_table(uri).get_add_actions(flatten=True)).to_pydict()
    total = 0
    for path, n in zip(actions["path"], actions["num_records"], strict=True):
        if path.rsplit("/", 1)[-1] in wanted:
            total += int(n or 0)
    return total
