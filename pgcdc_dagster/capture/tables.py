"""Per-table context: relation, converters, table URIs and app-transaction ids.

The context also decides where each column's values go in bronze when a column's type
changed (a versioned field, ``cdc/column_versions.py``) and records the table's shapes in
the LSN-keyed schema history (``lake/schema_history.py``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import psycopg2.extensions
import pyarrow as pa
from deltalake import DeltaTable

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.changes import Column, Relation, TableChanges
from pgcdc_dagster.cdc.column_options import (
    ColumnOptions,
    parse_column_options,
    project_changes,
    with_key,
)
from pgcdc_dagster.cdc.column_versions import (
    assign_field,
    column_of,
    compatible,
    renamed,
    superseded_of,
    versions,
)
from pgcdc_dagster.cdc.envelope import bronze_schema
from pgcdc_dagster.cdc.typeconv import ColumnConverter, PgType, TypeModes, converter_for
from pgcdc_dagster.cdc.typeconv.defaults import with_default
from pgcdc_dagster.lake.delta import committed_version, open_table
from pgcdc_dagster.lake.evolution import SchemaChangeError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.schema_history import (
    Entry,
    HistoryBatch,
    HistoryRecorder,
    Shape,
    history_uri,
)
from pgcdc_dagster.lake.silver import silver_schema, toastable_columns
from pgcdc_dagster.names import table_id
from pgcdc_dagster.postgres.catalog import (
    ColumnFacts,
    load_types,
    table_column_defaults,
    table_columns,
)

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
    committed: tuple[pa.Field, ...] = ()
    """The fields of bronze's ``after`` struct when the context was built (the committed
    schema the versioned field names are chosen against)."""
    history: HistoryRecorder | None = field(default=None, compare=False, repr=False)
    """Records the shapes of the events written (None: no schema history)."""
    offset: int | None = field(default=None, compare=False)
    """Bronze's offset (app transaction) when the context was built: None before the table's
    first commit. It only grows, so a run's checks may trust a value that is set."""
    _shapes: dict[Relation, tuple[ColumnConverter, ...]] = field(
        default_factory=dict, compare=False, repr=False)
    _shape_ids: dict[int, Shape] = field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
        """The table's identity as text (:func:`pgcdc_dagster.names.table_id`)."""
        return table_id(self.relation.namespace, self.relation.name)

    @cached_property
    def bronze_schema(self) -> pa.Schema:
        """Built once per context (a run asks several times per table: commits, reports)."""
        return bronze_schema(self.relation, self.converters)

    @cached_property
    def silver_schema(self) -> pa.Schema:
        """Built once per context."""
        return silver_schema(self.relation, self.converters)

    @property
    def toastable(self) -> list[str]:
        return toastable_columns(self.relation, self.converters)

    @property
    def silver_toastable(self) -> list[str]:
        """:attr:`toastable` as silver column names (a versioned bronze field's column)."""
        names = self._bronze_to_silver()
        return [names.get(n, n) for n in self.toastable]

    def silver_names(self, unchanged: pa.Array) -> pa.Array:
        """``__toast_unchanged`` lists (bronze field names) as silver column names."""
        names = self._bronze_to_silver()
        if all(k == v for k, v in names.items()):
            return unchanged
        return pa.array([None if row is None else [names.get(n, n) for n in row]
                         for row in unchanged.to_pylist()], pa.list_(pa.string()))

    def silver_converters(self) -> tuple[ColumnConverter, ...]:
        """The converters silver reads this table's bronze events with.

        The context's own, each also reading the bronze fields this run's stream wrote the
        column to when a shape the context was not built for came by (a column renamed and
        retyped in one window: ``ALTER ... RENAME a TO b``, then ``ALTER b TYPE bigint``,
        leaves events in ``b__v2`` beside the context's ``b``). Silver applies the run's
        events with the context, so without them those events' values were lost.
        """
        if not self._shapes:
            return self.converters
        seen: dict[str, list[ColumnConverter]] = {}
        for convs in self._shapes.values():  # in the order the stream met them
            for conv in convs:
                seen.setdefault(column_of(conv.bronze_field), []).append(conv)
        out = []
        for conv in self.converters:
            known = {conv.bronze_field.name, *(s.bronze_field.name for s in superseded_of(conv))}
            extra: list[ColumnConverter] = []
            for other in seen.get(column_of(conv.bronze_field), ()):
                if other.bronze_field.name not in known:
                    known.add(other.bronze_field.name)
                    extra.append(other)
            out.append(renamed(conv, conv.bronze_field.name,
                               (*reversed(extra), *superseded_of(conv))) if extra else conv)
        return tuple(out)

    def _bronze_to_silver(self) -> dict[str, str]:
        return {c.bronze_field.name: c.silver_field.name for c in self.converters}

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
        (a column added, or its type changed, mid-stream: a changed type gets a versioned
        bronze field). The segment's shape is recorded in the schema history at its first
        event's position when it differs from the shape in force there.

        Raises:
            SchemaChangeError: a key column's type changed (bronze keys and the silver MERGE
                key cannot follow it; re-snapshot the table).
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
            convs = self.converters
        else:
            cached = self._shapes.get(seg.relation)
            if cached is None:
                cached = self._shapes[seg.relation] = self._converters_for(
                    seg.relation, plain, relation)
            convs = cached
        self._record(seg, convs)
        return seg, convs

    def _record(self, seg: TableChanges, convs: tuple[ColumnConverter, ...]) -> None:
        if self.history is None or not len(seg) or not seg.commit_lsn:
            return
        shape = self._shape_ids.get(id(convs))
        if shape is None:
            shape = self._shape_ids[id(convs)] = Shape.of(seg.relation, convs)
        ordinal = seg.total_order[0] if seg.total_order else 0
        self.history.record(shape, int(seg.commit_lsn[0]), int(ordinal))

    def _converters_for(self, shaped: Relation, plain: Sequence[ColumnConverter],
                        full: Relation) -> tuple[ColumnConverter, ...]:
        """Converters of a shape the context was not built for: the context's own for the
        columns it knows unchanged (so their schemas, and the Delta field metadata, stay
        the same), the plain ones, with the column options applied and their bronze field
        chosen against the committed schema (a versioned field for a changed type), for the
        others."""
        by_name = dict(zip([c.name for c in full.columns], plain, strict=True))
        mine = {c.name: (c, conv) for c, conv in zip(self.relation.columns, self.converters,
                                                     strict=True)}
        fresh = [c for c in shaped.columns if c.name not in mine or not _same_column(
            mine[c.name][0], c)]
        mapped: dict[str, ColumnConverter] = {}
        if fresh:
            sub = dataclasses.replace(shaped, columns=tuple(fresh))
            _, convs = self.options.shape(sub, [by_name[c.name] for c in fresh], {})
            # Fields chosen earlier in this run (the context's own, and shapes seen in earlier
            # windows, maybe committed since the context read the bronze schema).
            pending = [conv.bronze_field for conv in self.converters]
            pending += [conv.bronze_field for convs in self._shapes.values() for conv in convs]
            for col, conv in zip(fresh, convs, strict=True):
                name = assign_field(col.name, conv.bronze_field, self.committed, pending,
                                    columns=[c.name for c in shaped.columns])
                if name != col.name and col.is_key:
                    raise _key_type_changed(self.name, col.name)
                mapped[col.name] = renamed(conv, name)
                pending.append(mapped[col.name].bronze_field)
        return tuple(mapped[c.name] if c.name in mapped else mine[c.name][1]
                     for c in shaped.columns)


def _key_type_changed(table: str, column: str) -> SchemaChangeError:
    return SchemaChangeError(
        f"bronze of {table}: the type of key column {column} changed; bronze keys and the "
        "silver MERGE key cannot follow a key's type change. Move the table's bronze and "
        "silver directories aside and snapshot it again (or exclude the table).")


def _same_column(a: Column, b: Column) -> bool:
    return (a.name, a.type_oid, a.typmod) == (b.name, b.type_oid, b.typmod)


def converters_for(columns: Sequence[Column], types: dict[int, object],
                   modes: TypeModes, *, not_null: Collection[str] = (),
                   defaults: Mapping[str, str] | None = None) -> list[ColumnConverter]:
    """One converter per column (dropped columns included, flagged ``dropped``).

    Columns named in ``not_null`` get required (``optional: false``) schemas, as Debezium
    gives NOT NULL columns (EVT-08/09), and the type's zero for a missing value. A column
    with a default expression in ``defaults`` gets the default Debezium propagates into its
    schema (TYPE-19..22, ``cdc/typeconv/defaults.py``).
    """
    out = []
    for c in columns:
        pgtype = types[c.type_oid]
        conv = converter_for(c.name, pgtype, c.typmod, modes,  # type: ignore[arg-type]
                             nullable=c.name not in not_null)
        if defaults and c.name in defaults:
            conv = with_default(conv, pgtype.name, defaults[c.name])  # type: ignore[attr-defined]
        out.append(conv)
    return out


def build_context(conn: psycopg2.extensions.connection, relation: Relation,
                  settings: CaptureSettings, *,
                  type_cache: MutableMapping[int, PgType] | None = None,
                  histories: Mapping[tuple[str, str], list[Entry]] | None = None,
                  history_batch: HistoryBatch | None = None,
                  facts: ColumnFacts | None = None) -> TableContext:
    """Resolve the relation's column types and build its context.

    Columns whose type Debezium omits are dropped; NOT NULL columns get required schemas
    (EVT-08/09); then the column options apply (``column.include.list``/
    ``column.exclude.list``, the column mappers and ``message.key.columns``; see
    ``cdc/column_options.py``). A column whose encoding differs from the one bronze holds
    gets a versioned bronze field (``cdc/column_versions.py``), with converters for its
    older fields so silver reads every event. The context's shape is recorded in the schema
    history at the table's offset when it is not the shape in force there.

    ``type_cache``, ``histories`` (:func:`read_histories`) and ``facts``
    (:func:`column_facts`) let a caller building many contexts resolve types, read the
    schema history and the columns' NOT NULL flags and defaults once for all of them (no
    catalog query per table); with ``history_batch`` their new history entries are written
    together when it is flushed.

    Raises:
        SchemaChangeError: a key column's type changed since bronze stored it.
    """
    schema, table = relation.namespace, relation.name
    types = load_types(conn, {c.type_oid for c in relation.columns}, cache=type_cache)
    if facts is None:
        facts = ColumnFacts(
            frozenset(name for name, _, _, nn in table_columns(conn, schema, table) if nn),
            table_column_defaults(conn, schema, table))
    convs = converters_for(relation.columns, types, settings.modes,  # type: ignore[arg-type]
                           not_null=facts.not_null, defaults=facts.defaults)
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
    bronze_uri = table_uri(settings.lakehouse, "bronze", schema, table)
    bronze = open_table(bronze_uri)
    committed = _after_fields(bronze)
    converters = _versioned(conn, rel, converters, committed, settings, options)
    # The app id is only ever read in this table's own Delta log, so its plain
    # schema.table (kept: stored offsets name it) need not tell "a.b".c from a."b.c".
    app_id = f"{settings.app_prefix}:bronze:{schema}.{table}"
    offset = committed_version(bronze, app_id)
    history = HistoryRecorder(history_uri(settings.lakehouse), schema, table,
                              None if histories is None else histories.get((schema, table), []),
                              batch=history_batch) if settings.lakehouse else None
    if history is not None:
        if offset is None:  # no event stored yet: the history starts here
            history.restart(Shape.of(rel, converters))
        else:
            # Ordinal 1: snapshot rows at the offset (ordinal 0) keep the shape they were
            # read in; streamed events there have ordinals from 1.
            history.record(Shape.of(rel, converters), offset, 1)
    return TableContext(
        relation=rel,
        converters=converters,
        bronze_uri=bronze_uri,
        silver_uri=table_uri(settings.lakehouse, "silver", schema, table),
        bronze_app_id=app_id,
        silver_app_id=f"{settings.app_prefix}:silver:{schema}.{table}",
        options=options,
        committed=committed,
        history=history,
        offset=offset,
    )


def _after_fields(bronze: DeltaTable | None) -> tuple[pa.Field, ...]:
    if bronze is None:
        return ()
    arrow = bronze.schema().to_arrow()
    current = arrow if isinstance(arrow, pa.Schema) else pa.schema(arrow)
    if current.get_field_index("after") < 0:
        return ()
    after = current.field("after").type
    return tuple(after.field(i) for i in range(after.num_fields))


def _versioned(conn: psycopg2.extensions.connection, relation: Relation,
               converters: Sequence[ColumnConverter], committed: Sequence[pa.Field],
               settings: CaptureSettings, options: ColumnOptions
               ) -> tuple[ColumnConverter, ...]:
    """The converters with each column's bronze field chosen against the committed schema;
    a versioned one carries converters of the column's older fields (newest first)."""
    out = []
    for col, conv in zip(relation.columns, converters, strict=True):
        name = assign_field(col.name, conv.bronze_field, committed,
                            columns=[c.name for c in relation.columns])
        if name == col.name:
            out.append(conv)
            continue
        if col.is_key:
            raise _key_type_changed(f"{relation.namespace}.{relation.name}", col.name)
        older = [f for f in versions(committed, col.name) if f.name != name]
        superseded = [c for c in (_converter_of_field(conn, relation, f, settings, options)
                                  for f in reversed(older)) if c is not None]
        out.append(renamed(conv, name, superseded))
    return tuple(out)


def _converter_of_field(conn: psycopg2.extensions.connection, relation: Relation,
                        stored: pa.Field, settings: CaptureSettings, options: ColumnOptions
                        ) -> ColumnConverter | None:
    """A converter that decodes an older bronze field of a column, rebuilt from the
    PostgreSQL type its metadata names; None (with a warning) when that is impossible."""
    meta = {k.decode(): v.decode() for k, v in (stored.metadata or {}).items()}
    column = column_of(stored)
    with conn.cursor() as cur:
        cur.execute("SELECT to_regtype(%s)::oid", (meta.get("pg.type", ""),))
        row = cur.fetchone()
    oid = int(row[0]) if row and row[0] is not None else None
    types = load_types(conn, {oid}) if oid is not None else {}
    if oid is None or oid not in types:
        log.warning("%s.%s: the type %s of bronze field %s no longer exists; silver cannot "
                    "decode that field's older events", relation.namespace, relation.name,
                    meta.get("pg.type"), stored.name)
        return None
    conv = converter_for(column, types[oid], int(meta.get("pg.typmod", "-1")),
                         settings.modes, nullable=True)
    col = Column(column, oid, int(meta.get("pg.typmod", "-1")), False)
    sub = dataclasses.replace(relation, columns=(col,))
    _, (conv,) = options.shape(sub, [conv], types)
    if not compatible(stored, conv.bronze_field):
        log.warning("%s.%s: bronze field %s cannot be decoded with its recorded type %s",
                    relation.namespace, relation.name, stored.name, meta.get("pg.type"))
        return None
    return renamed(conv, stored.name)


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
