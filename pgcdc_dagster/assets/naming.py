"""Every name one capture gives its definitions: :class:`CaptureNames`.

A capture named ``app`` (``pgcdc_definitions(name="app", ...)``) prefixes its resource keys
(``app_postgres``), jobs (``app_cdc_microbatch``), schedules, sensors, pool
(``app_pgcdc_slot``), dynamic partitions and slot-level asset keys (``app/source/
replication_slot``, ``app/bronze/_pgcdc/messages``, ``app/incremental/snapshot``) with its name;
its table keys are the translator's. So several captures merge into one code location and one
instance without sharing a name. The unnamed capture (``name=""``) keeps the plain names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import dagster as dg

from pgcdc_dagster.assets.translator import Layer, PgcdcTableProps, PgcdcTranslator
from pgcdc_dagster.capture.run_context import RunContext
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.names import table_of_path
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

RESOURCES = ("postgres", "lakehouse", "capture", "spark")
"""The resources of a capture, by their unprefixed keys."""
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")


class Bound(NamedTuple):
    """One capture's resources as a run has them."""

    postgres: PostgresResource
    lakehouse: LakehouseResource
    capture: CaptureResource
    spark: SparkResource


@dataclass(frozen=True)
class CaptureNames:
    """The names of one capture's definitions (see the module)."""

    name: str = ""
    translator: PgcdcTranslator = field(default_factory=PgcdcTranslator, compare=False)
    owners: tuple[str, ...] = ()
    _keys: dict[tuple[str, str, str], dg.AssetKey] = field(
        default_factory=dict, compare=False, repr=False)
    _tables: dict[dg.AssetKey, tuple[str, str]] = field(
        default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.name and not _NAME.fullmatch(self.name):
            raise ConfigurationError(
                f"capture name {self.name!r} is not a valid name: use a letter followed by "
                "letters, digits or underscores (at most 63), e.g. 'app' or 'billing_db'")

    def scoped(self, base: str) -> str:
        """``<name>_<base>`` (``base`` for the unnamed capture)."""
        return f"{self.name}_{base}" if self.name else base

    def resource_key(self, kind: str) -> str:
        """The resource key of ``postgres`` / ``lakehouse`` / ``capture`` / ``spark``."""
        return self.scoped(kind)

    @property
    def resource_keys(self) -> set[str]:
        return {self.resource_key(k) for k in RESOURCES}

    def bound(self, context: Any) -> Bound:
        """The capture's resources of a run, sensor or schedule context."""
        resources = context.resources
        return Bound(*(getattr(resources, self.resource_key(k)) for k in RESOURCES))

    def run_context(self, bound: Bound, run_id: str,
                    tables: Iterable[tuple[str, str]]) -> RunContext:
        """What the engine needs of one run, built once from its resources."""
        return RunContext(
            settings=bound.capture.settings(bound.postgres.dsn, bound.lakehouse.root),
            spark=bound.spark.lazy(), tables=frozenset(tables),
            source=bound.postgres.describe(), run_id=run_id)

    @property
    def pool(self) -> str:
        """The concurrency pool of everything that reads this capture's slot (limit 1)."""
        return self.scoped("pgcdc_slot")

    def slot_level(self, *path: str) -> dg.AssetKey:
        return dg.AssetKey([self.name, *path] if self.name else list(path))

    @property
    def slot_key(self) -> dg.AssetKey:
        return self.slot_level("source", "replication_slot")

    def meta_key(self, name: str) -> dg.AssetKey:
        """A capture-wide bronze table, ``bronze/_pgcdc/<name>``."""
        return self.slot_level("bronze", "_pgcdc", name)

    @property
    def incremental_key(self) -> dg.AssetKey:
        return self.slot_level("incremental", "snapshot")

    @property
    def partitions(self) -> dg.DynamicPartitionsDefinition:
        """The incremental snapshot's dynamic partitions: one per captured table."""
        return dg.DynamicPartitionsDefinition(name=self.scoped("pgcdc_incremental_tables"))

    def props(self, layer: Layer, schema: str, table: str) -> PgcdcTableProps:
        return PgcdcTableProps(self.name, layer, schema, table, self.owners)

    def spec(self, layer: Layer, schema: str, table: str) -> dg.AssetSpec:
        """The translator's spec of one asset of one table."""
        return self.translator.get_asset_spec(self.props(layer, schema, table))

    def key(self, layer: Layer, schema: str, table: str) -> dg.AssetKey:
        """The translator's key of one asset of one table (asked once per table)."""
        found = self._keys.get((layer, schema, table))
        if found is None:
            found = self._keys[(layer, schema, table)] = self.spec(layer, schema, table).key
            self._tables[found] = (schema, table)
        return found

    def table_of(self, key: dg.AssetKey) -> tuple[str, str]:
        """The ``(schema, table)`` of a table's asset key that :meth:`key` gave."""
        found = self._tables.get(key)
        return found if found is not None else table_of_path(key.path)

    def source(self, schema: str, table: str) -> dg.AssetKey:
        return self.key("source", schema, table)

    def bronze(self, schema: str, table: str) -> dg.AssetKey:
        return self.key("bronze", schema, table)

    def silver(self, schema: str, table: str) -> dg.AssetKey:
        return self.key("silver", schema, table)


DEFAULT_NAMES = CaptureNames()
"""The unnamed capture: plain names (``postgres``, ``cdc_microbatch``, ``pgcdc_slot``)."""

__all__ = ["DEFAULT_NAMES", "RESOURCES", "Bound", "CaptureNames"]
