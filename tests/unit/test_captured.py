"""CapturedTables without a database: bronze URIs as table_uri gives them, lookups of tables
not captured build nothing."""

from __future__ import annotations

import pytest

from pgcdc_dagster.capture.captured import CapturedTables
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.lake.paths import table_uri

NAMES = [("public", "orders"), ("Mixed Case", "we.ird"), ("_pgcdc", "x"), ("a/b", "c~d"),
         ("ünï", "çødé"), ("a.b", ".c.")]


@pytest.mark.parametrize("root", ["/lake/./root/", "file:///lake/root", "s3://bucket/lake/",
                                  "relative/lake"])
def test_bronze_uri_is_table_uri(root: str) -> None:
    tables = CapturedTables(CaptureSettings(dsn="", lakehouse=root),
                            [Relation(i, s, t, "d", ()) for i, (s, t) in enumerate(NAMES)])
    assert [tables.bronze_uri(n) for n in NAMES] == [table_uri(root, "bronze", *n)
                                                     for n in NAMES]


def test_tables_not_captured_are_not_built() -> None:
    tables = CapturedTables(CaptureSettings(dsn="", lakehouse="/lake"),
                            [Relation(1, "public", "orders", "d", ())])
    assert tables.get(("public", "other")) is None and ("public", "other") not in tables
    with pytest.raises(KeyError):
        tables[("public", "other")]
    assert list(tables) == [("public", "orders")] and len(tables) == 1
    assert tables.built() == {}
