"""Column names Delta cannot store side by side."""

from __future__ import annotations

from pgcdc_dagster.cdc.column_names import RESERVED_COLUMNS, column_name_problems
from pgcdc_dagster.lake.silver import META_NAMES, TOAST_UNCHANGED


def test_reserved_are_silvers_own_columns() -> None:
    assert set(RESERVED_COLUMNS) == {*META_NAMES, TOAST_UNCHANGED}


def test_problems_name_the_columns() -> None:
    assert column_name_problems(["id", "Name", "name_", "it's", "a + b", "__opx"]) == []
    assert column_name_problems(["id", "Name", "name"]) == [
        "columns 'Name' and 'name' differ only in letter case, and Delta Lake column names "
        "are case-insensitive"]
    for name in [*RESERVED_COLUMNS, "__OP", "__Deleted"]:
        (problem,) = column_name_problems(["id", name])
        assert repr(name) in problem and "silver's metadata column" in problem
