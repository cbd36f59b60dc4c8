"""Silver file layout and upkeep on real Delta tables: the merge rewrites only the
files holding the batch's keys, compaction keeps key clustering and the app transaction,
vacuum keeps what time travel within the retention needs and removes what is older, a
checkpoint keeps the app transaction, and delta-rs, DuckDB, Polars and Spark read the same
rows after merges and upkeep."""

from __future__ import annotations

import itertools
import time

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from pgcdc_dagster.cdc.changes import Column, Relation
from pgcdc_dagster.lake.data_files import read_file, stored_files
from pgcdc_dagster.lake.silver import META_FIELDS, merge_batch
from pgcdc_dagster.lake.silver_rewrite import apply_rewrite
from pgcdc_dagster.lake.upkeep import checkpoint, compact, vacuum
from tests.support.delta_log import commit_actions, last_commit_files

pytestmark = pytest.mark.spark

REL = Relation(1, "public", "items", "d", (Column("id", 20, -1, True),
                                           Column("name", 25, -1, False)))
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()),
                    *META_FIELDS])
APP = "t:silver:public.items"
TARGET = 16 << 10


def _rows(ids: list[int], lsn: int, *, deleted: bool = False) -> pa.Table:
    n = len(ids)
    return pa.Table.from_pydict({
        "id": ids, "name": [None if deleted else f"name {i} at {lsn}" for i in ids],
        "__op": ["d" if deleted else "u"] * n, "__lsn": [lsn] * n, "__commit_lsn": [lsn] * n,
        "__ordinal": list(range(n)), "__source_ts_ms": [lsn] * n, "__deleted": [deleted] * n,
    }, schema=SCHEMA)


def _merge(uri: str, rows: pa.Table, version: int) -> None:
    merge_batch(uri, rows, pa.nulls(rows.num_rows, pa.list_(pa.string())), relation=REL,
                toastable=["name"], app_id=APP, version=version, truncate_seq=None,
                target_file_bytes=TARGET)


def _content(table: pa.Table) -> list[tuple]:
    rows = table.select(["id", "name", "__deleted"]).sort_by("id")
    return list(zip(*(rows[c].to_pylist() for c in rows.column_names), strict=True))


def _ranges(uri: str) -> list[tuple[int, int]]:
    return sorted((f.low, f.high) for f in stored_files(DeltaTable(uri), "id"))


def test_merge_compaction_vacuum_and_readers(spark, tmp_path) -> None:
    uri = str(tmp_path / "silver")
    _merge(uri, _rows(list(range(0, 20_000, 2)), 100), 1)  # even keys: clustered files
    files = stored_files(DeltaTable(uri), "id")
    assert len(files) > 4
    ranges = _ranges(uri)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))  # no overlap

    # A few keys: exactly the files holding them are removed, each rewritten sorted.
    keys = [10, 10_000, 19_998]
    holding = {f.path for f in files if any(f.low <= k <= f.high for k in keys)}
    _merge(uri, _rows(keys, 200), 2)
    removed, added = last_commit_files(uri)
    assert removed == holding and len(holding) == 3 and len(added) == 3
    assert {f.path for f in files} - holding <= {f.path for f in
                                                 stored_files(DeltaTable(uri), "id")}
    # A replay (older sequence) and a delete of a key that never existed.
    _merge(uri, _rows([10], 150), 3)
    assert last_commit_files(uri) == (set(), set())
    _merge(uri, _rows([7], 300, deleted=True), 4)  # a tombstone inside a stored range
    for i, version in ((1, 5), (3, 6), (5, 7)):  # odd keys: small files overlapping ranges
        _merge(uri, _rows(list(range(i, 20_000, 997)), 400 + i), version)
    before = DeltaTable(uri)
    v_before, content = before.version(), _content(before.to_pyarrow_table())
    small_before = sum(1 for f in stored_files(before, "id") if f.size < TARGET / 2)

    result = compact(uri, ["id"], TARGET)
    after = DeltaTable(uri)
    assert result.groups and not result.conflicts
    assert _content(after.to_pyarrow_table()) == content
    ranges = _ranges(uri)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))  # re-clustered
    assert sum(1 for f in stored_files(after, "id") if f.size < TARGET / 2) < small_before
    for f in stored_files(after, "id"):  # every file sorted by key, with key statistics
        ids = read_file(uri, f.path, SCHEMA, ["id"])["id"].to_numpy()
        assert (np.diff(ids) > 0).all() and (f.low, f.high) == (ids[0], ids[-1])
    actions = commit_actions(uri, after.version())
    assert not [a for a in actions if "txn" in a]  # compaction records no app transaction
    # dataChange = true: delta-rs ignores dataChange = false removals in its conflict check
    assert all(a[k]["dataChange"] for a in actions for k in ("add", "remove") if k in a)
    assert after.transaction_version(APP) == 7

    # Checkpoint: the table opens from it with its app transaction.
    assert checkpoint(uri) == after.version()
    assert (tmp_path / "silver" / "_delta_log" / f"{after.version():020d}.checkpoint.parquet"
            ).exists()
    assert DeltaTable(uri).transaction_version(APP) == 7

    # Vacuum: files removed within the retention stay (time travel to v_before works) ...
    assert vacuum(uri, 1) == 0
    assert _content(DeltaTable(uri, version=v_before).to_pyarrow_table()) == content
    # ... files removed longer ago than the retention go, and so does time travel to them.
    _merge(uri, _rows(list(range(20_001, 20_400, 2)), 900), 8)
    _merge(uri, _rows(list(range(20_401, 20_800, 2)), 901), 9)
    v_old = DeltaTable(uri).version()
    old = compact(uri, ["id"], TARGET, now_ms=int((time.time() - 3 * 3600) * 1000))
    assert old.files_removed >= 2
    assert vacuum(uri, 1) == old.files_removed
    with pytest.raises(Exception):  # noqa: B017 (delta-rs/pyarrow: the file is gone)
        DeltaTable(uri, version=v_old).to_pyarrow_table()
    current = DeltaTable(uri)
    expected = _content(current.to_pyarrow_table())
    keys = {*range(0, 20_000, 2), 7, *(k for i in (1, 3, 5) for k in range(i, 20_000, 997)),
            *range(20_001, 20_800, 2)}
    assert [r[0] for r in expected] == sorted(keys) and current.transaction_version(APP) == 9

    # Readers agree: delta-rs (above), Polars, DuckDB and Spark (the files delta-rs lists).
    files = current.file_uris()
    assert _content(pl.read_delta(uri).to_arrow()) == expected
    duck = duckdb.sql("SELECT id, name, __deleted FROM read_parquet($f)",
                      params={"f": files}).arrow()
    assert _content(pa.table(duck)) == expected
    sdf = spark.read.parquet(*files).select("id", "name", "__deleted")
    assert sorted(tuple(r) for r in sdf.collect()) == expected


def test_a_batch_that_loses_a_commit_race_to_compaction_is_refused_then_redone(tmp_path
                                                                              ) -> None:
    """The batch was planned on a version whose files compaction then replaced: delta-rs
    refuses its commit (it removes a file already removed), the files it wrote are deleted,
    and merge_batch's retry applies it once on the new version."""
    uri = str(tmp_path / "silver")
    for version, start in enumerate(range(0, 400, 100), start=1):  # four small files
        _merge(uri, _rows(list(range(start, start + 100)), 100 + version), version)
    stale = DeltaTable(uri)
    assert compact(uri, ["id"], TARGET).files_removed == 4
    on_disk = set((tmp_path / "silver").glob("*.parquet"))
    source = _rows([5, 250], 500).append_column(
        "__toast_unchanged", pa.nulls(2, pa.list_(pa.string())))
    with pytest.raises(CommitFailedError):
        apply_rewrite(stale, uri, source, keys=["id"], toastable=["name"], app_id=APP,
                      version=5, metadata=None, target_file_bytes=TARGET)
    assert set((tmp_path / "silver").glob("*.parquet")) == on_disk  # its files deleted
    assert DeltaTable(uri).transaction_version(APP) == 4  # nothing of it committed
    _merge(uri, _rows([5, 250], 500), 5)
    rows = DeltaTable(uri).to_pyarrow_table()
    assert rows.num_rows == 400 and DeltaTable(uri).transaction_version(APP) == 5
    names = dict(zip(rows["id"].to_pylist(), rows["name"].to_pylist(), strict=True))
    assert names[5] == "name 5 at 500" and names[250] == "name 250 at 500"
