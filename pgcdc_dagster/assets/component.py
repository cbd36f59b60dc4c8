"""``PgcdcComponent``: one capture as a Dagster Component, configured by a ``defs.yaml``.

    dg scaffold defs pgcdc_dagster.PgcdcComponent app_capture

writes ``defs/app_capture/defs.yaml``; edit it:

    type: pgcdc_dagster.PgcdcComponent
    attributes:
      name: app
      dsn_env: APP_PG_DSN          # the source's libpq DSN is read from this variable
      tables: [public.orders, public.customers]
      slot: app_cdc
      lakehouse: /data/lake/app
      key_prefix: [app]            # translation: key prefix and group of the table assets
      capture:                     # any CaptureResource field (Debezium property names)
        snapshot_mode: initial

Each component is :func:`~pgcdc_dagster.assets.factory.pgcdc_definitions` of its attributes,
so several merge into one code location (``dg check defs``, ``dg dev``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from pgcdc_dagster.assets.factory import pgcdc_definitions
from pgcdc_dagster.assets.translator import PgcdcTranslator
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

TEMPLATE: dict[str, Any] = {
    "name": "app",
    "dsn_env": "APP_PG_DSN",
    "tables": ["public.orders"],
    "slot": "app_cdc",
    "lakehouse": "lakehouse/app",
}
"""The attributes ``dg scaffold defs`` writes (edit them)."""


class PgcdcScaffolder(dg.Scaffolder):
    """Writes a ``defs.yaml`` with every attribute a capture needs."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        dg.scaffold_component(request, TEMPLATE)


@dg.scaffold_with(PgcdcScaffolder)
class PgcdcComponent(dg.Component, dg.Model, dg.Resolvable):
    """Change data capture of one PostgreSQL database into a Delta lakehouse (bronze change
    events, silver current state): its assets, checks, jobs, schedules and sensors, every
    name prefixed with ``name``."""

    name: str = Field(description="The capture's name: prefixes its resource keys, jobs, "
                      "schedules, sensors, pool and slot-level asset keys.")
    dsn_env: str = Field(description="Environment variable holding the source's libpq "
                         "connection string (read at run time, never stored).")
    lakehouse: str = Field(description="Root path or URI of this capture's lakehouse.")
    slot: str = Field(description="slot.name: the logical replication slot.")
    publication: str | None = Field(default=None,
                                    description="publication.name (default: the slot's name).")
    topic_prefix: str | None = Field(default=None, description="topic.prefix: source.name "
                                     "of the events (default: the capture's name).")
    tables: list[str] | None = Field(
        default=None, description="The captured tables, schema.table: the code location "
        "loads without reading the source. Without it, include is resolved against the "
        "source when it answers (cached in catalog).")
    include: str = Field(default="", description="table.include.list: comma-separated "
                         "schema.table regular expressions (when tables is not given).")
    catalog: str | None = Field(default=None, description="File caching the tables the "
                                "include list resolved to, for loads while the source is down.")
    capture: dict[str, Any] = Field(default_factory=dict, description="Further "
                                    "CaptureResource fields (snapshot_mode, ...).")
    spark_master: str = Field(default="local[2]", description="Spark master URL.")
    key_prefix: list[str] | None = Field(default=None, description="Prefix of the table "
                                         "assets' keys (default: [name]).")
    group_name: str | None = Field(default=None, description="Group of the table assets "
                                   "(default: <name>_source, <name>_bronze, <name>_silver).")

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        fields: dict[str, Any] = {
            "slot": self.slot, "publication": self.publication or self.slot,
            "topic_prefix": self.topic_prefix or self.name, "tables": self.include,
            **self.capture}
        root = self.lakehouse
        if "://" not in root and not Path(root).is_absolute():  # relative to the project
            root = str(Path(context.project_root) / root)
        return pgcdc_definitions(
            name=self.name,
            postgres=PostgresResource(dsn=dg.EnvVar(self.dsn_env)),
            lakehouse=LakehouseResource(root=root),
            capture=CaptureResource(**fields),
            spark=SparkResource(master=self.spark_master),
            translator=PgcdcTranslator(key_prefix=self.key_prefix if self.key_prefix
                                       is not None else [self.name],
                                       group_name=self.group_name),
            tables=self.tables, catalog=self.catalog)


__all__ = ["PgcdcComponent"]
