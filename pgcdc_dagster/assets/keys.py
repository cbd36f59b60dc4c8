"""Asset keys, tags and op input/output names of captured tables (pgcdc_dagster.names).

Dagster derives op input and output names from asset keys in ways that are not injective
(``a_b.c`` and ``a.b_c`` give the same input name), so the multi-assets and multi-checks here
name them with :func:`pgcdc_dagster.names.identifier`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any

import dagster as dg

from pgcdc_dagster.names import asset_path, display_name, identifier, table_of_path, tag_value

SLOT_KEY = dg.AssetKey(["source", "replication_slot"])
"""The logical replication slot (and its publication) as an external asset."""


def table_key(layer: str, schema: str, table: str) -> dg.AssetKey:
    """``<layer>/<schema>/<table>`` with unusual names escaped (pgcdc_dagster.names)."""
    return dg.AssetKey(asset_path(layer, schema, table))


def source_key(schema: str, table: str) -> dg.AssetKey:
    return table_key("source", schema, table)


def bronze_key(schema: str, table: str) -> dg.AssetKey:
    return table_key("bronze", schema, table)


def silver_key(schema: str, table: str) -> dg.AssetKey:
    return table_key("silver", schema, table)


def table_of_key(key: dg.AssetKey) -> tuple[str, str]:
    """The ``(schema, table)`` of a table's asset key (any layer)."""
    return table_of_path(key.path)


def table_tags(layer: str, schema: str, table: str) -> dict[str, str]:
    """``pgcdc/layer``, and ``pgcdc/schema`` / ``pgcdc/table`` when valid tag values."""
    tags = {"pgcdc/layer": layer}
    for key, value in (("pgcdc/schema", schema), ("pgcdc/table", table)):
        tag = tag_value(value)
        if tag is not None:
            tags[key] = tag
    return tags


def table_metadata(schema: str, table: str) -> dict[str, str]:
    """The real names, as definition metadata of a table's assets."""
    return {"pgcdc/schema": schema, "pgcdc/table": table,
            "pgcdc/source_table": display_name(schema, table)}


@lru_cache(maxsize=1 << 16)
def _name(key: dg.AssetKey) -> str:
    """The op input/output name of an asset: :func:`identifier` for a table's, else the
    components joined by ``__`` (the slot, the capture-wide tables: fixed plain names).
    Cached: the definitions name every table's keys several times."""
    try:
        return identifier(key.path[0], *table_of_key(key))
    except ValueError:
        return "__".join(key.path)


def dep_ins(deps: Iterable[dg.AssetKey]) -> dict[str, dg.AssetIn]:
    return {_name(k): dg.AssetIn(key=k, dagster_type=dg.Nothing)
            for k in dict.fromkeys(deps)}


def multi_check(*, name: str, specs: Sequence[dg.AssetCheckSpec], pool: str | None = None,
                resource_keys: set[str] | None = None
                ) -> Callable[[Callable[..., Any]], dg.AssetChecksDefinition]:
    """``@multi_asset_check(can_subset=True)`` with collision-free output and input names."""
    by_output = {f"{_name(s.asset_key)}_{s.name}": s for s in specs}
    ins = {_name(s.asset_key): s.asset_key for s in specs}

    def inner(fn: Callable[..., Any]) -> dg.AssetChecksDefinition:
        # One In and one Out shared by every table (immutable records): Dagster resolves
        # the type of each one it is given (thousands of tables).
        nothing_in, optional_out = dg.In(dg.Nothing), dg.Out(dg.Nothing, is_required=False)
        op_def = dg.op(
            name=name, pool=pool, required_resource_keys=resource_keys,
            ins=dict.fromkeys(ins, nothing_in),
            out=dict.fromkeys(by_output, optional_out))(fn)
        checks: dg.AssetChecksDefinition = dg.AssetChecksDefinition.create(
            keys_by_input_name=ins, node_def=op_def, check_specs_by_output_name=by_output,
            can_subset=True)
        return checks

    return inner

