"""Silver reads bronze parts back with only the ``source`` fields it uses (half of
a part's decoded size is the envelope's ``source``), older parts conformed to the current
schema (fields added later are null)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pgcdc_dagster.cdc.silver_batch import INPUT_COLUMNS, SOURCE_FIELDS
from pgcdc_dagster.lake.bronze_read import _read_paths, read_files

SOURCE = pa.struct([pa.field("version", pa.string()), pa.field("ts_ms", pa.int64()),
                    pa.field("db", pa.string()), pa.field("lsn", pa.int64())])
IMAGE = pa.struct([pa.field("id", pa.int64()), pa.field("name", pa.string())])
SCHEMA = pa.schema([
    pa.field("key", pa.struct([pa.field("id", pa.int64())])), pa.field("before", IMAGE),
    pa.field("after", IMAGE), pa.field("source", SOURCE), pa.field("op", pa.string()),
    pa.field("__commit_lsn", pa.int64()), pa.field("__ordinal", pa.int64()),
    pa.field("__toast_unchanged", pa.list_(pa.string())),
])


def _part(path: Path, n: int, offset: int, *, with_name: bool) -> str:
    image = IMAGE if with_name else pa.struct([IMAGE.field("id")])
    rows = [{"id": offset + i, **({"name": f"n{offset + i}"} if with_name else {})}
            for i in range(n)]
    data = pa.table({
        "key": pa.array([{"id": offset + i} for i in range(n)], SCHEMA.field("key").type),
        "before": pa.nulls(n, image), "after": pa.array(rows, image),
        "source": pa.array([{"version": "2.7", "ts_ms": 1000 + offset + i, "db": "app",
                             "lsn": 5000 + offset + i} for i in range(n)], SOURCE),
        "op": ["c"] * n, "__commit_lsn": list(range(offset, offset + n)),
        "__ordinal": [0] * n, "__toast_unchanged": pa.nulls(n, pa.list_(pa.string())),
    })
    out = str(path / f"part-{offset}.parquet")
    pq.write_table(data, out)
    return out


def test_only_the_used_source_fields_are_read_and_old_parts_conform(tmp_path: Path) -> None:
    files = [_part(tmp_path, 3, 0, with_name=False), _part(tmp_path, 2, 10, with_name=True)]
    got = read_files(files, SCHEMA, INPUT_COLUMNS, SOURCE_FIELDS)
    assert got.column_names == list(INPUT_COLUMNS)
    assert got.schema.field("source").type == pa.struct(
        [SOURCE.field("lsn"), SOURCE.field("ts_ms")])
    assert got.column("source").to_pylist() == [
        {"lsn": 5000 + k, "ts_ms": 1000 + k} for k in (0, 1, 2, 10, 11)]
    # The part written before "name" existed reads it as null; the later one has it.
    assert [r["name"] for r in got.column("after").to_pylist()] == [None] * 3 + ["n10", "n11"]
    assert got.column("__commit_lsn").to_pylist() == [0, 1, 2, 10, 11]
    # The whole struct when no fields are named, as before.
    assert read_files(files[:1], SCHEMA, INPUT_COLUMNS).schema.field("source").type == SOURCE


def test_the_paths_read_name_the_struct_fields() -> None:
    wanted = pa.schema([SCHEMA.field("op"), pa.field("source", pa.struct(
        [SOURCE.field("lsn"), SOURCE.field("ts_ms")]))])
    assert _read_paths(SCHEMA, wanted, SOURCE_FIELDS) == ["op", "source.lsn", "source.ts_ms"]
    older = pa.schema([SCHEMA.field("op"), pa.field("source", pa.struct([SOURCE.field("lsn")]))])
    assert _read_paths(older, wanted, SOURCE_FIELDS) == ["op", "source.lsn"]
