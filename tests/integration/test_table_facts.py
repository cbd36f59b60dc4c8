"""What the checks read of a table's Delta logs, locally and on an object store (moto).

``still_at`` tells whether anything committed after a version (the comparison's guard
against a run committing between the read of the versions and the slot lock) by two stats
of the log instead of a replay; it must agree with a fresh open of the table.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from pgcdc_dagster.lake.delta import append_arrow, ensure_table, open_table
from pgcdc_dagster.ops.table_facts import still_at

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
