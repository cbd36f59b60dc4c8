"""Per-table context: relation, converters, table URIs and app-transaction ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg2.extensions
import pyarrow as pa
from pgcdc_dagster.postgres.catalog import load_types

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.changes import Column, Relation
from pgcdc_dagster.cdc.envelope import bronze_schema
from pgcdc_dagster.cdc.typeconv import ColumnConverter, TypeModes, converter_for
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.silver import silver_schema, toastable_columns


@dataclass(frozen=True)
class TableContext:
    """Everything needed to write one captured table's bronze and silver."""

    relation: Relation
    """The relation restricted to the columns that are captured (dropped ones removed)."""
    converters: tuple[ColumnConverter, ...]
    bronze_uri: str
    silver_uri: str
    bronze_app_id: str
    silver_app_id: str

    @property
    def name(self) -> str:
        return f"{self.relation.namespace}.{self.relation.name}"

    @property
    def bronze_schema(self) -> pa.Schema:
        return bronze_schema(self.relation, self.converters)

    @property
    def silver_schema(self) -> pa.Schema:
        return silver_schema(self.relation, self.converters)

    @property
    def toastable(self) -> list[str]:
        return toastable_columns(self.relation, self.converters)

    @property
    def captured_positions(self) -> tuple[int, ...]:
        return tuple(range(len(self.relation.columns)))


def converters_for(columns: Sequence[Column], types: dict[int, object],
                   modes: TypeModes) -> list[ColumnConverter]:
    """One converter per column (dropped columns included, flagged ``dropped``)."""
    return [converter_for(c.name, types[c.type_oid], c.typmod, modes)  # type: ignore[arg-type]
            for c in columns]


def build_context(conn: psycopg2.extensions.connection, relation: Relation,
                  settings: CaptureSettings) -> TableContext:
    """Resolve the relation's column types and build its context."""
    types = load_types(conn, {c.type_oid for c in relation.columns})
    convs = converters_for(relation.columns, types, settings.modes)  # type: ignore[arg-type]
    kept = [(col, conv) for col, conv in zip(relation.columns, convs, strict=True)
            if not conv.dropped]
    rel = Relation(relation.oid, relation.namespace, relation.name, relation.replica_identity,
                   tuple(c for c, _ in kept))
    schema, table = relation.namespace, relation.name
    return TableContext(
        relation=rel,
        converters=tuple(c for _, c in kept),
        bronze_uri=table_uri(settings.lakehouse, "bronze", schema, table),
        silver_uri=table_uri(settings.lakehouse, "silver", schema, table),
        bronze_app_id=f"{settings.app_prefix}:bronze:{schema}.{table}",
        silver_app_id=f"{settings.app_prefix}:silver:{schema}.{table}",
    )
