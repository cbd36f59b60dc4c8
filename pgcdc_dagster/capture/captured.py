"""The captured tables of one run: the catalog read once, each table's context built on use.

A table's context (:func:`~pgcdc_dagster.capture.tables.build_context`) opens its bronze
Delta table, reads its offset and records its shape in the schema history: milliseconds per
table. A micro-batch over a thousand mostly idle tables must not pay that for every
table, so :class:`CapturedTables` holds the relations, types and column facts read in
bulk and builds a table's context only when something asks for it: the WAL window carries
events for the table, the snapshot step reads it, its silver catches up, a check reads it.

Whether an idle table has its offset (the snapshot step's question) is answered without
opening it when the capture-set log (``capture/stream.py``) says the last windows were read
for it and its bronze directory still exists; otherwise bronze is opened as before.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

import psycopg2.extensions

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.tables import TableContext, build_context
from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.typeconv import PgType
from pgcdc_dagster.lake.delta import committed_version, open_table
from pgcdc_dagster.lake.paths import is_local, normalise_root, table_segments
from pgcdc_dagster.lake.schema_history import Entry, HistoryBatch, history_uri, read_histories
from pgcdc_dagster.names import table_id
from pgcdc_dagster.postgres.catalog import ColumnFacts
from pgcdc_dagster.postgres.connection import connect

TableName = tuple[str, str]


class CapturedTables(Mapping[TableName, TableContext]):
    """The captured tables by ``(schema, table)``, in catalog order; a context is built the
    first time it is looked up (thread-safe: the bronze writer looks tables up on its own
    thread) and kept for the run."""

    def __init__(self, settings: CaptureSettings, relations: Sequence[Relation], *,
                 types: dict[int, PgType] | None = None,
                 facts: Mapping[int, ColumnFacts] | None = None,
                 built: Sequence[TableContext] = ()) -> None:
        self.settings = settings
        self.relations: list[Relation] = list(relations)
        self.names: list[TableName] = [r.qualified for r in self.relations]
        self._by_name = {r.qualified: r for r in self.relations}
        self._types: dict[int, PgType] = types if types is not None else {}
        self._facts = facts
        self._built: dict[TableName, TableContext] = {c.relation.qualified: c for c in built}
        self._histories: list[dict[tuple[str, str], list[Entry]]] = []  # read once, shared
        self._capture_set: frozenset[TableName] | None = None
        self._root: str | None = None
        self._lock = threading.RLock()
        self._conn: list[psycopg2.extensions.connection] = []  # opened by the first build

    @classmethod
    def of(cls, contexts: Sequence[TableContext] | CapturedTables,
           settings: CaptureSettings) -> CapturedTables:
        """``contexts`` as captured tables (contexts built already are kept as they are)."""
        if isinstance(contexts, CapturedTables):
            return contexts
        return cls(settings, [c.relation for c in contexts], built=contexts)

    # --- Mapping ------------------------------------------------------------------------

    def __getitem__(self, name: TableName) -> TableContext:
        ctx = self._built.get(name)
        if ctx is not None:
            return ctx
        if name not in self._by_name:
            raise KeyError(name)
        return self.build([name])[0]

    def get(self, name: TableName, default: TableContext | None = None  # type: ignore[override]
            ) -> TableContext | None:
        # Not Mapping.get: a KeyError raised while building must not read as "not captured".
        return self[name] if name in self._by_name else default

    def __iter__(self) -> Iterator[TableName]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    # --- building -----------------------------------------------------------------------

    def build(self, names: Collection[TableName]) -> list[TableContext]:
        """The contexts of ``names`` (in that order), those not built yet built together:
        one connection, the schema history read once and their new entries in one append."""
        with self._lock:
            missing = [n for n in names if n not in self._built]
            if missing:
                self._build(missing)
            return [self._built[n] for n in names]

    def _build(self, names: Sequence[TableName]) -> None:
        settings = self.settings
        if not self._histories and settings.lakehouse:
            self._histories.append(read_histories(history_uri(settings.lakehouse)))
        histories = self._histories[0] if self._histories else None
        batch = HistoryBatch(history_uri(settings.lakehouse)) if settings.lakehouse else None
        if not self._conn or self._conn[0].closed:
            # One connection for every build of the run (a window may wake many tables one
            # by one); rarely queried: types and column facts were read in bulk.
            self._conn[:] = [connect(settings.dsn)]
        conn = self._conn[0]
        for name in names:
            relation = self._by_name[name]
            self._built[name] = build_context(
                conn, relation, settings, type_cache=self._types,
                histories=histories, history_batch=batch,
                facts=None if self._facts is None else self._facts.get(relation.oid))
        if batch is not None:
            batch.flush()

    def close(self) -> None:
        """Close the connection the builds used (a later build opens another)."""
        with self._lock:
            for conn in self._conn:
                conn.close()
            self._conn.clear()

    def __enter__(self) -> CapturedTables:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subset(self, names: Collection[TableName]) -> CapturedTables:
        """The tables of ``names`` (in table order), sharing this object's contexts: one
        built through either is built for both."""
        view = CapturedTables(self.settings, [r for r in self.relations if r.qualified in names],
                              types=self._types, facts=self._facts)
        view._built, view._histories, view._lock = self._built, self._histories, self._lock
        view._conn = self._conn
        return view

    def built(self) -> dict[TableName, TableContext]:
        """The contexts built so far."""
        with self._lock:
            return dict(self._built)

    def contexts(self, names: Collection[TableName] | None = None) -> list[TableContext]:
        """Contexts of ``names`` (every table when None), built as needed, in table order."""
        chosen = self.names if names is None else [n for n in self.names if n in names]
        return self.build(chosen)

    def named(self, ids: Collection[str]) -> list[TableContext]:
        """Contexts of the tables whose identity text (:attr:`TableContext.name`) is in
        ``ids``, in table order; the others are not built."""
        return self.build([n for n in self.names if table_id(*n) in ids])

    # --- offsets without opening ----------------------------------------------------------

    def bronze_uri(self, name: TableName) -> str:
        """:func:`table_uri` of the table's bronze, the lakehouse root resolved once (a
        path's resolution, times a thousand tables)."""
        if self._root is None:
            self._root = normalise_root(self.settings.lakehouse)
        return "/".join((self._root, "bronze", *table_segments(*name)))

    def offset(self, name: TableName) -> int | None:
        """The table's bronze offset now, read from bronze without building the context (a
        built context's offset may be older: a snapshot since moved it)."""
        app_id = f"{self.settings.app_prefix}:bronze:{name[0]}.{name[1]}"
        return committed_version(open_table(self.bronze_uri(name)), app_id)

    def has_offset(self, name: TableName, capture_set: Callable[[], frozenset[TableName]]
                   ) -> bool:
        """True when bronze holds the table's offset.

        Not opened when windows were last read for the table (``capture_set()``: the last
        capture set of the capture-set log; a table enters it only with its offset, and an
        offset is never removed but with bronze itself) and its bronze directory exists
        (a local lakehouse; on an object store bronze is opened)."""
        ctx = self._built.get(name)
        if ctx is not None and ctx.offset is not None:
            return True
        uri = self.bronze_uri(name)
        if ctx is None and is_local(uri) and name in self._last_set(capture_set) and \
                os.path.isdir(os.path.join(uri, "_delta_log")):
            return True
        return self.offset(name) is not None

    def _last_set(self, capture_set: Callable[[], frozenset[TableName]]
                  ) -> frozenset[TableName]:
        if self._capture_set is None:
            self._capture_set = capture_set()
        return self._capture_set
