"""Composition root: the Dagster definitions of this project.

``defs`` is loaded lazily (``@dg.definitions``): the include list is resolved against the
source catalog when the code location loads, not at import, so a reload picks up new tables
and an unreachable source is reported in the UI as a load error naming the problem.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import dagster as dg

from assets import CAPTURE_POOL, build_capture_assets, source_specs
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.discovery import check_server, resolve_tables
from resources import CaptureResource, LakehouseResource, PostgresResource, SparkResource
from resources.capture import split_list

DEFAULT_LAKEHOUSE = "./lakehouse"
_CAPTURE_ENV = {
    "tables": "PGCDC_TABLES",
    "slot": "PGCDC_SLOT",
    "publication": "PGCDC_PUBLICATION",
    "topic_prefix": "PGCDC_TOPIC_PREFIX",
    "snapshot_mode": "PGCDC_SNAPSHOT_MODE",
}


def _env_or(name: str, default: str) -> str | dg.EnvVar:
    return dg.EnvVar(name) if os.environ.get(name) else default


def default_resources() -> dict[str, dg.ConfigurableResource]:  # type: ignore[type-arg]
    """Resources configured from the documented environment variables."""
    capture_kwargs: dict[str, object] = {
        field: dg.EnvVar(env) for field, env in _CAPTURE_ENV.items() if os.environ.get(env)
    }
    return {
        "postgres": PostgresResource(dsn=dg.EnvVar("PGCDC_PG_DSN")),
        "lakehouse": LakehouseResource(root=_env_or("PGCDC_LAKEHOUSE", DEFAULT_LAKEHOUSE)),
        "capture": CaptureResource(**capture_kwargs),  # type: ignore[arg-type]
        "spark": SparkResource(master=_env_or("PGCDC_SPARK_MASTER", "local[2]")),
    }


def discover_tables(dsn: str, include: Sequence[str], exclude: Sequence[str] = ()
                    ) -> list[tuple[str, str]]:
    """The captured ``(schema, table)`` pairs, resolved against the source catalog."""
    with connection(dsn) as conn:
        check_server(conn)
        return [r.qualified for r in resolve_tables(conn, include, exclude)]


def build_definitions(tables: Sequence[tuple[str, str]],
                      resources: Mapping[str, object] | None = None) -> dg.Definitions:
    """Definitions for the given tables (tests pass resources; the loader uses the env)."""
    capture_assets = build_capture_assets(tables)
    selection = dg.AssetSelection.groups("bronze", "silver")
    initial_snapshot = dg.define_asset_job(
        "initial_snapshot", selection=selection,
        description="Create the slot, snapshot every captured table (bronze op=r and the "
        "silver baseline), then catch up with the stream.",
        config={"ops": {"bronze": {"config": {"snapshot_step": True}}}},
        executor_def=dg.in_process_executor,
    )
    microbatch = dg.define_asset_job(
        "cdc_microbatch", selection=selection,
        description="Read bounded slot windows into bronze (exactly once), merge silver, "
        "advance the slot.",
        executor_def=dg.in_process_executor,
    )
    return dg.Definitions(
        assets=[*source_specs(tables), *capture_assets],
        jobs=[initial_snapshot, microbatch],
        resources=dict(resources) if resources is not None else default_resources(),
    )


@dg.definitions
def defs() -> dg.Definitions:
    """Definitions resolved from the environment (PGCDC_PG_DSN, PGCDC_TABLES, ...)."""
    dsn = os.environ.get("PGCDC_PG_DSN")
    if not dsn:
        raise ConfigurationError(
            "PGCDC_PG_DSN is not set: export the libpq connection string of the source "
            "database, e.g. PGCDC_PG_DSN='host=127.0.0.1 port=5432 dbname=app user=cdc'.")
    include = split_list(os.environ.get("PGCDC_TABLES", ""))
    tables = discover_tables(dsn, include)
    return build_definitions(tables)


__all__ = ["CAPTURE_POOL", "build_definitions", "defs", "discover_tables"]
