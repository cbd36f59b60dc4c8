"""Silver's live row count (``dagster/row_count``) from the files' ``__deleted`` statistics.

A file whose ``__deleted`` maximum is false holds no tombstone and one whose minimum is true
holds no live row: the count comes from the Delta log alone (a snapshot's silver, whose data
files are then not read: truncated here, the count still comes out). A file holding both, or
without statistics, makes the column be read, as before.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from pgcdc_dagster.ops.delta_stats import live_row_count


def _rows(ids: range, deleted: list[bool | None]) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()),
                     "__deleted": pa.array(deleted, pa.bool_())})


def _scanned(uri: str) -> int:
    return int(DeltaTable(uri).to_pyarrow_dataset().count_rows(filter=~pc.field("__deleted")))


def test_live_rows_from_stats_or_from_the_column(tmp_path: Path) -> None:
    uri = str(tmp_path / "silver")
    write_deltalake(uri, _rows(range(0, 5), [False] * 5))
    write_deltalake(uri, _rows(range(5, 8), [True] * 3), mode="append")
    write_deltalake(uri, _rows(range(8, 10), [None, False]), mode="append")
    assert live_row_count(uri) == _scanned(uri) == 6
    for path in DeltaTable(uri).file_uris():  # decided by the log: no data file is read
        Path(path.removeprefix("file://")).write_bytes(b"")
    assert live_row_count(uri) == 6

    mixed = str(tmp_path / "mixed")
    write_deltalake(mixed, _rows(range(0, 4), [False, True, False, None]))
    write_deltalake(mixed, _rows(range(4, 6), [False, False]), mode="append")
    assert live_row_count(mixed) == _scanned(mixed) == 4

    empty = str(tmp_path / "empty")
    write_deltalake(empty, _rows(range(0), []))
    assert live_row_count(empty) == 0
    assert live_row_count(str(tmp_path / "none")) is None
