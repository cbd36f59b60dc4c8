"""Silver file pruning for keys other than integers: uuid, text (long values whose
statistics are cut or dropped among them) and a bigint + text composite key. A merge of a few
keys reads the key columns only of the files whose Delta statistics can hold them and
rewrites exactly the files holding them (checked against the files' own rows, not their
statistics); a key beyond a cut statistic is still found (no duplicate); delta-rs, Polars,
DuckDB and Spark read the same rows afterwards."""

from __future__ import annotations

import json
import random
import uuid

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.cdc.changes import Column, Relation
from pgcdc_dagster.lake.data_files import read_file, stored_files
from pgcdc_dagster.lake.file_stats import STRING_PREFIX
from pgcdc_dagster.lake.silver import META_FIELDS, merge_batch
from tests.support.delta_log import commit_actions, last_commit_files

pytestmark = pytest.mark.spark

TARGET = 16 << 10
UUID, TEXT, INT8 = 2950, 25, 20


def _table(kind: str) -> tuple[Relation, pa.Schema, list[tuple]]:
    """The relation, silver schema and initial keys of one scenario."""
    if kind == "uuid":
        rel = Relation(1, "public", "u", "d", (Column("id", UUID, -1, True),
                                               Column("name", TEXT, -1, False)))
        rng = random.Random(17)
        keys = [(str(uuid.UUID(int=rng.getrandbits(128))),) for _ in range(6000)]
        fields = [pa.field("id", pa.string(), nullable=False)]
    elif kind == "text":
        rel = Relation(2, "public", "t", "d", (Column("code", TEXT, -1, True),
                                               Column("name", TEXT, -1, False)))
        # Short codes, codes sharing a prefix longer than the statistics keep, and one code
        # over 4 KiB (Parquet drops its file's statistics: they come from the data).
        keys = [(f"c{i:05d}",) for i in range(6000)]
        keys += [("p" * 40 + f"{i:05d}",) for i in range(2000)]
        keys += [("z" * 5000,)]
        fields = [pa.field("code", pa.string(), nullable=False)]
    else:
        rel = Relation(3, "public", "c", "d", (Column("tenant", INT8, -1, True),
                                               Column("sku", TEXT, -1, True),
                                               Column("name", TEXT, -1, False)))
        keys = [(t, f"sku-{i:05d}") for t in (1, 2, 3) for i in range(2000)]
        fields = [pa.field("tenant", pa.int64(), nullable=False),
                  pa.field("sku", pa.string(), nullable=False)]
    return rel, pa.schema([*fields, ("name", pa.string()), *META_FIELDS]), keys


def _rows(schema: pa.Schema, keys: list[tuple], lsn: int) -> pa.Table:
    n = len(keys)
    key_names = [f.name for f in schema][:len(keys[0])]
    data: dict[str, list] = {k: [key[i] for key in keys] for i, k in enumerate(key_names)}
    data.update({"name": [f"{key} at {lsn}" for key in keys], "__op": ["u"] * n,
                 "__lsn": [lsn] * n, "__commit_lsn": [lsn] * n, "__ordinal": list(range(n)),
                 "__source_ts_ms": [lsn] * n, "__deleted": [False] * n})
    return pa.Table.from_pydict(data, schema=schema)


def _merge(uri: str, rel: Relation, rows: pa.Table, version: int) -> dict[str, int]:
    return merge_batch(uri, rows, pa.nulls(rows.num_rows, pa.list_(pa.string())),
                       relation=rel, toastable=["name"], app_id="a", version=version,
                       truncate_seq=None, target_file_bytes=TARGET)


def _holding(uri: str, schema: pa.Schema, keys: list[tuple]) -> set[str]:
    """The files whose rows hold one of ``keys`` (read from the files themselves)."""
    names = [f.name for f in schema][:len(keys[0])]
    out = set()
    for f in stored_files(DeltaTable(uri), names):
        data = read_file(uri, f.path, schema, names)
        stored = set(zip(*(data[n].to_pylist() for n in names), strict=True))
        if stored & set(keys):
            out.add(f.path)
    return out


@pytest.mark.parametrize("kind", ["uuid", "text", "composite"])
def test_a_merge_of_a_few_keys_reads_and_rewrites_only_their_files(spark, tmp_path, kind
                                                                   ) -> None:
    rel, schema, keys = _table(kind)
    names = list(rel.key_names)
    uri = str(tmp_path / kind)
    _merge(uri, rel, _rows(schema, keys, 100), 1)
    files = stored_files(DeltaTable(uri), names)
    assert len(files) > 8
    stats = [json.loads(a["add"]["stats"]) for a in commit_actions(uri, 1) if "add" in a]
    with_stats = [s for s in stats if all(n in s["minValues"] for n in names)]
    assert len(with_stats) == len(stats)

    picked = [keys[i] for i in (3, len(keys) // 2, len(keys) - 2)]
    if kind == "text":
        picked += [("p" * 40 + "01234",), ("z" * 5000,)]  # beyond a cut statistic; no stats
    holding = _holding(uri, schema, picked)
    counts = _merge(uri, rel, _rows(schema, picked, 200), 2)
    removed, _ = last_commit_files(uri)
    assert removed == holding and counts["updated"] == len(picked) and not counts["inserted"]
    # Pruned before reading: far fewer files read than the table has (the text scenario
    # reads every file whose cut range covers the long shared prefix).
    prefixed = sum(1 for f in files if str(f.high).startswith("p" * STRING_PREFIX))
    bound = len(picked) + 2 + (prefixed if kind == "text" else 0)
    assert counts["files_read"] <= bound < len(files), (counts["files_read"], len(files))

    # New keys inside stored ranges and a replay: nothing lost, nothing duplicated.
    if kind == "uuid":
        extra = [(str(uuid.uuid4()),) for _ in range(5)]
    elif kind == "text":
        extra = [("p" * 40 + "01234x",), ("c00001a",)]
    else:
        extra = [(2, "sku-00001a"), (4, "sku-00000")]
    _merge(uri, rel, _rows(schema, extra, 300), 3)
    _merge(uri, rel, _rows(schema, picked, 150), 4)  # older than what silver holds
    assert last_commit_files(uri) == (set(), set())

    table = DeltaTable(uri)
    expected = sorted((*k, f"{k} at {200 if k in picked else 300 if k in extra else 100}")
                      for k in [*keys, *extra])
    cols = [*names, "name"]
    got = table.to_pyarrow_table(columns=cols)
    assert sorted(zip(*(got[c].to_pylist() for c in cols), strict=True)) == expected
    polars = pl.read_delta(uri).select(cols).to_arrow()
    assert sorted(zip(*(polars[c].to_pylist() for c in cols), strict=True)) == expected
    duck = duckdb.sql(f"SELECT {', '.join(cols)} FROM read_parquet($f)",
                      params={"f": table.file_uris()}).fetchall()
    assert sorted(duck) == expected
    sdf = spark.read.parquet(*table.file_uris()).select(*cols)
    assert sorted(tuple(r) for r in sdf.collect()) == expected
    # delta-rs's own data skipping on the new statistics keeps every matching row.
    for key in (*picked, *extra):
        hit = table.to_pyarrow_table(columns=cols, filters=[
            (n, "=", v) for n, v in zip(names, key, strict=True)])
        assert hit.num_rows == 1, key
