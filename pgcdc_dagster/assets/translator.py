"""How a captured table becomes Dagster asset specs: :class:`PgcdcTranslator`.

In the style of ``DagsterDltTranslator``: subclass it and override :meth:`get_asset_spec` (or
pass ``key_prefix`` / ``group_name``) to choose the keys, key prefixes, groups, owners, tags,
descriptions and kinds of the source, bronze and silver assets of each table. Jobs, checks and
sensors use the keys it returns (never group names), so renaming a group or prefixing a key
changes nothing they select.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import dagster as dg

from pgcdc_dagster.names import asset_path, display_name, tag_value

Layer = Literal["source", "bronze", "silver"]
LAYERS: tuple[Layer, ...] = ("source", "bronze", "silver")

_KINDS: dict[str, set[str]] = {"source": {"postgres"}, "bronze": {"postgres", "spark", "delta"},
                               "silver": {"spark", "delta"}}


@dataclass(frozen=True)
class PgcdcTableProps:
    """What the translator is told about one asset of one captured table."""

    capture: str
    """The capture's name (``pgcdc_definitions(name=...)``; empty for an unnamed capture)."""
    layer: Layer
    schema: str
    table: str
    owners: tuple[str, ...] = ()
    """The owners the capture was configured with (``PGCDC_OWNERS``)."""

    @property
    def table_name(self) -> str:
        """``schema.table`` as the source names it (the source's ``dagster/table_name``;
        bronze and silver are ``bronze.schema.table`` and ``silver.schema.table``)."""
        return display_name(self.schema, self.table)


def _description(props: PgcdcTableProps) -> str:
    name = props.table_name
    if props.layer == "source":
        return f"PostgreSQL table {name} (captured through the slot)."
    if props.layer == "bronze":
        return (f"Change events of {name} in Debezium's envelope (key, before, after, source, "
                "op, ts_ms, transaction): one row per change, op r for the snapshot, "
                "append-only Delta under <lakehouse>/bronze/, written exactly once per slot "
                "window.")
    return (f"Current state of {name}: one row per key in native Delta types, under "
            "<lakehouse>/silver/. Deleted keys stay as tombstones: read live rows WHERE NOT "
            "__deleted.")


class PgcdcTranslator:
    """Asset specs of captured tables. ``key_prefix`` goes before every table key
    (``[*key_prefix, layer, schema, table]``); ``group_name`` replaces the default groups
    (``source`` / ``bronze`` / ``silver``, ``<capture>_bronze`` ... for a named capture)."""

    def __init__(self, *, key_prefix: Sequence[str] = (), group_name: str | None = None
                 ) -> None:
        self.key_prefix = tuple(key_prefix)
        self.group_name = group_name

    def get_asset_spec(self, props: PgcdcTableProps) -> dg.AssetSpec:
        """The spec of one asset of one table. The key must be unique per table and layer
        (the definitions refuse duplicates); everything else is free."""
        tags: dict[str, str] = {"pgcdc/layer": props.layer}
        for name, value in (("pgcdc/schema", props.schema), ("pgcdc/table", props.table)):
            tag = tag_value(value)
            if tag is not None:
                tags[name] = tag
        if props.capture:
            tags["pgcdc/capture"] = props.capture
        return dg.AssetSpec(
            dg.AssetKey([*self.key_prefix, *asset_path(props.layer, props.schema,
                                                        props.table)]),
            group_name=self.group_name or (f"{props.capture}_{props.layer}" if props.capture
                                           else props.layer),
            kinds=_KINDS[props.layer],
            owners=list(props.owners), tags=tags, description=_description(props),
            metadata={"pgcdc/schema": props.schema, "pgcdc/table": props.table,
                      "pgcdc/source_table": props.table_name,
                      "dagster/table_name": props.table_name if props.layer == "source"
                      else f"{props.layer}.{props.table_name}"})


__all__ = ["LAYERS", "Layer", "PgcdcTableProps", "PgcdcTranslator"]
