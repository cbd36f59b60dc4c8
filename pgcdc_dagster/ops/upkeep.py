"""Upkeep of one captured table's bronze and silver (the silver_maintenance job).

Compaction (``lake/upkeep.py``), then vacuum, then a log checkpoint, for bronze and silver;
the figures the UI shows are read afterwards. Silver's key columns are the fields of
bronze's ``key`` struct (no source connection is needed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.lake.delta import open_table
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.upkeep import (
    CompactionResult,
    checkpoint,
    compact,
    compact_bronze,
    last_compaction_ms,
    vacuum,
)


@dataclass
class LayerUpkeep:
    """What one upkeep run did to one Delta table, and the table afterwards."""

    layer: str
    uri: str
    compaction: CompactionResult = field(default_factory=CompactionResult)
    vacuumed_files: int = 0
    checkpoint_version: int | None = None
    files: int = 0
    bytes: int = 0
    live_rows: int = 0
    last_compaction_ms: int | None = None
    note: str = ""


def silver_keys(bronze_uri: str, silver_uri: str) -> list[str]:
    """The key columns: bronze's ``key`` struct fields that silver has."""
    bronze, silver = open_table(bronze_uri), open_table(silver_uri)
    if bronze is None or silver is None:
        return []
    b_schema = pa.schema(bronze.schema().to_arrow())
    s_names = set(pa.schema(silver.schema().to_arrow()).names)
    idx = b_schema.get_field_index("key")
    if idx < 0 or not pa.types.is_struct(b_schema.field(idx).type):
        return []
    key_type = b_schema.field(idx).type
    return [key_type.field(i).name for i in range(key_type.num_fields)
            if key_type.field(i).name in s_names]


def upkeep_table(lakehouse: str, schema: str, table: str, *, app_prefix: str,
                 target_bytes: int, retention_hours: int) -> list[LayerUpkeep]:
    """Compact, vacuum and checkpoint the table's bronze and silver."""
    bronze_uri = table_uri(lakehouse, "bronze", schema, table)
    silver_uri = table_uri(lakehouse, "silver", schema, table)
    bronze = LayerUpkeep("bronze", bronze_uri)
    silver = LayerUpkeep("silver", silver_uri)
    if open_table(bronze_uri) is None or open_table(silver_uri) is None:
        bronze.note = silver.note = "no Delta table yet"
        return [bronze, silver]
    bronze.compaction = compact_bronze(bronze_uri, silver_uri,
                                       f"{app_prefix}:silver:{schema}.{table}", target_bytes)
    keys = silver_keys(bronze_uri, silver_uri)
    if keys:
        silver.compaction = compact(silver_uri, keys, target_bytes)
    else:
        silver.note = "no key columns: silver is not compacted"
    for layer in (bronze, silver):
        layer.vacuumed_files = vacuum(layer.uri, retention_hours)
        layer.checkpoint_version = checkpoint(layer.uri)
        _measure(layer)
    return [bronze, silver]


def _measure(layer: LayerUpkeep) -> None:
    table = open_table(layer.uri)
    if table is None:
        return
    adds = pa.table(table.get_add_actions(flatten=True))
    layer.files = adds.num_rows
    if adds.num_rows:
        layer.bytes = int(pc.sum(adds["size_bytes"]).as_py() or 0)
    if layer.layer == "silver" and "__deleted" in pa.schema(table.schema().to_arrow()).names:
        layer.live_rows = int(table.to_pyarrow_dataset().count_rows(
            filter=~pc.field("__deleted")))
    elif adds.num_rows:
        layer.live_rows = int(pc.sum(adds["num_records"]).as_py() or 0)
    layer.last_compaction_ms = last_compaction_ms(layer.uri)
