"""What the checks read of a table's Delta logs, locally and on an object store (moto).

``still_at`` tells whether anything committed after a version (the comparison's guard
against a run committing between the read of the versions and the slot lock) by two stats
of the log instead of a replay; it must agree with a fresh open of the table.
"""

from __future__ import annotations

from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from pgcdc_dagster.lake.delta import append_arrow, ensure_table, open_table
from pgcdc_dagster.lake.storage import filesystem, storage_options
from pgcdc_dagster.ops.table_facts import plain_files, still_at

pytestmark = [pytest.mark.integration]
SCHEMA = pa.schema([pa.field("id", pa.int64())])


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "lake")
    return str(request.getfixturevalue("s3_lakehouse"))


def test_still_at_agrees_with_the_table_version(root: str) -> None:
    uri = f"{root}/silver/public/t"
    assert not still_at(uri, 0)  # no table yet
    ensure_table(uri, SCHEMA)
    assert still_at(uri, 0) and not still_at(uri, None)
    for version in (1, 2):
        append_arrow(uri, pa.table({"id": [version]}, schema=SCHEMA), app_id="t",
                     version=version)
        table = open_table(uri)
        assert table is not None and table.version() == version
        assert still_at(uri, version)
        assert not still_at(uri, version - 1)  # something committed after it
        assert not still_at(uri, version + 1)  # a version the table never had


def test_plain_files_read_back_the_version_they_were_listed_at(root: str) -> None:
    """The comparison reads silver from the files the sweep's facts listed (no second open):
    relative to the table root whatever the store, readable as they are (a name that needs
    percent-encoding included), and None when plain Parquet files are not the table."""
    uri = f"{root}/silver/public/Mixed Case"
    ensure_table(uri, SCHEMA)
    for version in (1, 2):
        append_arrow(uri, pa.table({"id": [version]}, schema=SCHEMA), app_id="t",
                     version=version)
    table = open_table(uri)
    assert table is not None
    files = plain_files(table)
    assert files is not None and len(files) == 2
    actions = pa.table(table.get_add_actions(flatten=False))["path"].to_pylist()
    assert sorted(unquote(f) for f in files) == sorted(unquote(a) for a in actions)
    fs, base = filesystem(uri)
    read = [pq.read_table(f"{base.rstrip('/')}/{unquote(f)}", filesystem=fs)["id"][0].as_py()
            for f in files]
    assert sorted(read) == [1, 2]
    parted = f"{root}/silver/public/parted"
    write_deltalake(parted, pa.table({"id": [1], "p": ["a"]}), partition_by=["p"],
                    storage_options=storage_options(parted))
    assert plain_files(DeltaTable(parted, storage_options=storage_options(parted))) is None
