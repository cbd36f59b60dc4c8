"""Per-table context: relation, converters, table URIs and app-transaction ids."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import psycopg2.extensions
import pyarrow as pa

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.changes import Column, Relation, TableChanges
from pgcdc_dagster.cdc.column_options import (
    ColumnOptions,
    parse_column_options,
    project_changes,
    with_key,
)
from pgcdc_dagster.cdc.envelope import bronze_schema
from pgcdc_dagster.cdc.typeconv import ColumnConverter, TypeModes, converter_for
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.silver import silver_schema, toastable_columns
from pgcdc_dagster.postgres.catalog import load_types

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableContext:
    """Everything needed to write one captured table's bronze and silver."""

    relation: Relation
    """The relation restricted to the columns that are captured (dropped and excluded ones
    removed), its key flagged (``message.key.columns`` applied)."""
    converters: tuple[ColumnConverter, ...]
    bronze_uri: str
    silver_uri: str
    bronze_app_id: str
    silver_app_id: str
    options: ColumnOptions = field(default_factory=ColumnOptions)
    """The capture's column options (``column.*``, ``message.key.columns``)."""
    _shapes: dict[Relation, tuple[ColumnConverter, ...]] = field(
        default_factory=dict, compare=False, repr=False)

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

    def shape(self, seg: TableChanges,
              base: Callable[[Relation], Sequence[ColumnConverter]]
              ) -> tuple[TableChanges, Sequence[ColumnConverter]]:
        """A streamed segment as this table captures it, and the converters to encode it.

        The segment is re-keyed to the table's key, projected onto the captured columns
        (excluded, unknown-type and dropped columns leave the row tuples) and paired with
        converters that apply the column options. When the segment's shape is the one the
        context was built for, these are the context's own converters, so the snapshot,
        the stream and silver encode every value alike. ``base`` gives the plain converters
        of a relation (the stream's converter cache) for shapes the context does not know
        (a column added mid-stream).
        """
        known = {c.name: c for c in self.relation.columns}
        schema, table = self.relation.namespace, self.relation.name
        relation = with_key(seg.relation, self.relation.key_names)
        seg.relation = relation
        plain = base(relation)
        keep = [c.name for c, conv in zip(relation.columns, plain, strict=True)
                if c.name in known or (not conv.dropped and (
                    c.is_key or self.options.captures(schema, table, c.name)))]
        seg = project_changes(seg, keep)
        if seg.relation.columns == self.relation.columns:
            return seg, self.converters
        cached = self._shapes.get(seg.relation)
        if cached is None:
            cached = self._shapes[seg.relation] = self._converters_for(seg.relation, plain,
                                                                       relation)
        return seg, cached

    def _converters_for(self, shaped: Relation, plain: Sequence[ColumnConverter],
                        full: Relation) -> tuple[ColumnConverter, ...]:
        """Converters of a shape the context was not built for: the context's own for the
        columns it knows unchanged (so their schemas, and the Delta field metadata, stay
        the same), the plain ones, with the column options applied, for the others."""
        by_name = dict(zip([c.name for c in full.columns], plain, strict=True))
        mine = {c.name: (c, conv) for c, conv in zip(self.relation.columns, self.converters,
                                                     strict=True)}
        fresh = [c for c in shaped.columns if c.name not in mine or not _same_column(
            mine[c.name][0], c)]
        mapped: dict[str, ColumnConverter] = {}
        if fresh:
            sub = dataclasses.replace(shaped, columns=tuple(fresh))
            _, convs = self.options.shape(sub, [by_name[c.name] for c in fresh], {})
            mapped = {c.name: conv for c, conv in zip(fresh, convs, strict=True)}
        return tuple(mapped[c.name] if c.name in mapped else mine[c.name][1]
                     for c in shaped.columns)


def _same_column(a: Column, b: Column) -> bool:
    return (a.name, a.type_oid, a.typmod) == (b.name, b.type_oid, b.typmod)


def converters_for(columns: Sequence[Column], types: dict[int, object],
                   modes: TypeModes, *, not_null: Collection[str] = ()
                   ) -> list[ColumnConverter]:
    """One converter per column (dropped columns included, flagged ``dropped``).

    Columns named in ``not_null`` get required (``optional: false``) schemas, as Debezium
    gives NOT NULL columns (EVT-08/09), and the type's zero for a missing value.
    """
    return [converter_for(c.name, types[c.type_oid], c.typmod, modes,  # type: ignore[arg-type]
                          nullable=c.name not in not_null)
            for c in columns]


def build_context(conn: psycopg2.extensions.connection, relation: Relation,
                  settings: CaptureSettings) -> TableContext:
    """Resolve the relation's column types and build its context.

    Columns whose type Debezium omits are dropped; then the column options apply
    (``column.include.list``/``column.exclude.list``, the column mappers and
    ``message.key.columns``; see ``cdc/column_options.py``).
    """
    types = load_types(conn, {c.type_oid for c in relation.columns})
    convs = converters_for(relation.columns, types, settings.modes)  # type: ignore[arg-type]
    kept = [(col, conv) for col, conv in zip(relation.columns, convs, strict=True)
            if not conv.dropped]
    rel = Relation(relation.oid, relation.namespace, relation.name, relation.replica_identity,
                   tuple(c for c, _ in kept))
    converters = tuple(c for _, c in kept)
    options = parse_column_options(tuple(settings.column_options))
    if options:
        primary = rel.key_names
        rel, converters = options.shape(rel, converters, types)
        if rel.key_names != primary:
            _check_custom_key(rel, primary)
    schema, table = relation.namespace, relation.name
    return TableContext(
        relation=rel,
        converters=converters,
        bronze_uri=table_uri(settings.lakehouse, "bronze", schema, table),
        silver_uri=table_uri(settings.lakehouse, "silver", schema, table),
        bronze_app_id=f"{settings.app_prefix}:bronze:{schema}.{table}",
        silver_app_id=f"{settings.app_prefix}:silver:{schema}.{table}",
        options=options,
    )


def _check_custom_key(relation: Relation, primary: Sequence[str]) -> None:
    """Warn when a ``message.key.columns`` key can change without silver seeing it.

    Silver replaces a row when its key changes only if the update carries the old key
    values: under REPLICA IDENTITY FULL always; otherwise only for the identity columns.
    """
    if relation.replica_identity == "f" or set(relation.key_names) <= set(primary):
        return
    log.warning(
        "%s.%s is keyed by message.key.columns (%s) but its REPLICA IDENTITY is not FULL: "
        "an update that changes those columns carries no old values, so silver keeps the "
        "row under its old key as well. Run ALTER TABLE %s.%s REPLICA IDENTITY FULL.",
        relation.namespace, relation.name, ", ".join(relation.key_names), relation.namespace,
        relation.name)
