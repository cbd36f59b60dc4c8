"""Composition root: the Dagster definitions of this project.

``defs`` is loaded lazily (``@dg.definitions``): the include list is resolved against the
source catalog when the code location loads, not at import, so a reload picks up new tables.
A source that does not answer never fails the load: the tables cached in ``PGCDC_CATALOG``
(written by every load that reached the source) are used, or none, and capture runs fail
naming the source (:mod:`pgcdc_dagster.assets.catalog`).

Dagster calls the loader several times in one process (``dagster job execute`` four times:
origin, repository, job, run): the catalog is read each time, but the definitions of the same
tables and settings are built once per process (:func:`_built`).

Importing this module changes nothing in the process (no collector, environment, warning
filter or thread is touched; nothing is started): process-level tuning is the deployment's
explicit choice (:func:`pgcdc_dagster.tuning.tune_process`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from functools import lru_cache

import dagster as dg

from pgcdc_dagster.assets import CAPTURE_POOL, build_capture_assets, source_specs
from pgcdc_dagster.assets.catalog import resolve_tables
from pgcdc_dagster.assets.checks import build_asset_checks
from pgcdc_dagster.assets.factory import keep_configured
from pgcdc_dagster.assets.incremental import build_incremental
from pgcdc_dagster.assets.jobs import LEAN_JOBS, build_jobs, build_lean_job
from pgcdc_dagster.assets.naming import RESOURCES, CaptureNames
from pgcdc_dagster.assets.operations import build_maintenance_job, build_teardown_job
from pgcdc_dagster.assets.schedules import build_maintenance_schedule, build_schedules
from pgcdc_dagster.assets.sensors import build_sensors
from pgcdc_dagster.assets.signals import build_signal_job, build_signal_sensor
from pgcdc_dagster.assets.translator import PgcdcTranslator
from pgcdc_dagster.cdc.plugins import PGOUTPUT
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.ops.settings import MonitorSettings, parse_bytes
from pgcdc_dagster.postgres.connection import connection, describe_dsn
from pgcdc_dagster.postgres.discovery import (
    KeyFor,
    Resolution,
    check_server,
    leave_out_partitioned,
    nothing_to_capture,
    resolve_capture,
)
from pgcdc_dagster.postgres.signals import parse_table_name
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)
from pgcdc_dagster.resources.capture import split_list
from pgcdc_dagster.run_process import job_of_process
from pgcdc_dagster.spark.session import check_master

DEFAULT_LAKEHOUSE = "./lakehouse"
_CAPTURE_ENV = {
    "tables": "PGCDC_TABLES",
    "slot": "PGCDC_SLOT",
    "publication": "PGCDC_PUBLICATION",
    "plugin_name": "PGCDC_PLUGIN_NAME",
    "topic_prefix": "PGCDC_TOPIC_PREFIX",
    "snapshot_mode": "PGCDC_SNAPSHOT_MODE",
    "signal_data_collection": "PGCDC_SIGNAL_DATA_COLLECTION",
}
_CAPTURE_INT_ENV = {
    "incremental_snapshot_chunk_size": "PGCDC_INCREMENTAL_CHUNK_SIZE",
    "tombstone_retention_hours": "PGCDC_TOMBSTONE_RETENTION_HOURS",
    "incremental_statement_timeout_ms": "PGCDC_INCREMENTAL_STATEMENT_TIMEOUT_MS",
    "vacuum_retention_hours": "PGCDC_VACUUM_RETENTION_HOURS",
    "target_file_bytes": "PGCDC_TARGET_FILE_BYTES",
}
_AT_LEAST = {"tombstone_retention_hours": 0, "vacuum_retention_hours": 1}
"""Lower bounds checked here; the engine's settings check the others (capture/settings.py)."""


def _env_or(name: str, default: str) -> str | dg.EnvVar:
    return dg.EnvVar(name) if os.environ.get(name) else default


def _capture_ints(environ: Mapping[str, str]) -> dict[str, int]:
    """The integer settings the environment sets (``target_file_bytes`` as a size: ``1MB``),
    each checked against its lower bound; ConfigurationError naming the variable."""
    out: dict[str, int] = {}
    for field, env in _CAPTURE_INT_ENV.items():
        text = environ.get(env, "").strip()
        if not text:
            continue
        if field == "target_file_bytes":
            value = parse_bytes(text, env)
        elif text.lstrip("-").replace("_", "").isdigit():
            value = int(text.replace("_", ""))
        else:
            raise ConfigurationError(f"{env} = {text!r} is not an integer; write e.g. "
                                     f"{CaptureResource.model_fields[field].default}")
        least = _AT_LEAST.get(field)
        if least is not None and value < least:
            raise ConfigurationError(f"{env} = {value} is out of range: use {least} or more")
        out[field] = value
    return out


def check_environment(environ: Mapping[str, str]) -> dict[str, int]:
    """Refuse, when the code location loads, what a run would refuse only once it started
    (some of it after creating the slot and the publication): an unknown snapshot mode or
    plugin, a slot name PostgreSQL refuses, a count out of range, a Spark master that is
    not one, a signalling table that is not ``schema.table``. Each message names the
    variable and the fix. Returns the integer settings."""
    ints = _capture_ints(environ)
    strings = {field: environ[env] for field, env in _CAPTURE_ENV.items() if environ.get(env)}
    CaptureResource(**strings, **ints).settings("", "")  # type: ignore[arg-type]
    if environ.get("PGCDC_SPARK_MASTER"):
        check_master(environ["PGCDC_SPARK_MASTER"])
    if environ.get("PGCDC_SIGNAL_DATA_COLLECTION", "").strip():
        try:
            parse_table_name(environ["PGCDC_SIGNAL_DATA_COLLECTION"])
        except ConfigurationError as exc:  # the sensor only skipped every tick with it
            raise ConfigurationError(f"PGCDC_SIGNAL_DATA_COLLECTION: {exc}") from None
    return ints


def default_resources() -> dict[str, dg.ConfigurableResource]:  # type: ignore[type-arg]
    """Resources configured from the documented environment variables (checked first:
    :func:`check_environment`)."""
    ints = check_environment(os.environ)
    capture_kwargs: dict[str, object] = {
        field: dg.EnvVar(env) for field, env in _CAPTURE_ENV.items() if os.environ.get(env)
    }
    capture_kwargs.update(ints)
    return {
        "postgres": PostgresResource(dsn=dg.EnvVar("PGCDC_PG_DSN")),
        "lakehouse": LakehouseResource(root=_env_or("PGCDC_LAKEHOUSE", DEFAULT_LAKEHOUSE)),
        "capture": CaptureResource(**capture_kwargs),  # type: ignore[arg-type]
        "spark": SparkResource(master=_env_or("PGCDC_SPARK_MASTER", "local[2]"),
                               driver_memory=os.environ.get("PGCDC_SPARK_DRIVER_MEMORY") or None),
    }


def discover_capture(dsn: str, include: Sequence[str], exclude: Sequence[str] = (), *,
                     key_for: KeyFor | None = None, plugin: str = PGOUTPUT) -> Resolution:
    """The captured tables and the matched ones left out, from the source catalog."""
    with connection(dsn) as conn:
        check_server(conn)
        found = resolve_capture(conn, include, exclude, key_for=key_for)
        leave_out_partitioned(conn, found, include, plugin)
        return found


def discover_tables(dsn: str, include: Sequence[str], exclude: Sequence[str] = (), *,
                    key_for: KeyFor | None = None, plugin: str = PGOUTPUT
                    ) -> list[tuple[str, str]]:
    """The captured ``(schema, table)`` pairs, resolved against the source catalog.

    Matched tables that cannot be captured are left out (the code location still loads;
    docs/operations.md, "Refusals and their fixes"). The load notes them at INFO, which a code
    server's log shows; the warning is each bronze run's own, in its event log. Every process
    that executes a run loads the code too, so a warning here printed it twice per run
    (``dagster job execute``: once at the load, once from the run).
    """
    found = discover_capture(dsn, include, exclude, key_for=key_for, plugin=plugin)
    if include and not found.relations:
        raise nothing_to_capture(include, found.skipped)
    if found.skipped:
        dg.get_dagster_logger("pgcdc_dagster").info(found.warning())
    return [r.qualified for r in found.relations]


def build_definitions(tables: Sequence[tuple[str, str]],
                      resources: Mapping[str, object] | None = None, *,
                      settings: MonitorSettings | None = None,
                      job: str | None = None, name: str = "",
                      translator: PgcdcTranslator | None = None) -> dg.Definitions:
    """Definitions for the given tables (tests pass resources; the loader uses the env).

    ``settings`` (schedule, lag trigger, check thresholds, owners) default to the
    ``PGCDC_*`` environment variables documented in docs/configuration.md. ``job``: one of
    the lean op jobs (``initial_snapshot``, ``cdc_microbatch``, ``capture_checks``) when the
    process only executes that job: then the definitions are that job and the resources, as
    the full definitions define them, without the assets, checks, schedules and sensors of
    every captured table (building those costs seconds with a thousand tables, and the job
    does not use them: it reports its events by asset key). Any other value (None, another
    job) builds everything.

    ``name`` namespaces every name of the definitions (:class:`CaptureNames`); ``resources``
    are given by their plain keys (``postgres``, ``lakehouse``, ``capture``, ``spark``) and
    bound under the capture's. ``translator`` makes the tables' asset specs.
    """
    settings = settings if settings is not None else MonitorSettings.from_env(os.environ)
    names = CaptureNames(name, translator or PgcdcTranslator(), settings.owners)
    # The environment's resources keep their values under partial run config (a capture
    # resource given only tombstones_on_delete kept topic_prefix at its default before).
    given = dict(resources) if resources is not None else {
        key: keep_configured(resource) for key, resource in default_resources().items()}
    resource_defs = {names.resource_key(k) if k in RESOURCES else k: v for k, v in given.items()}
    if job in LEAN_JOBS:
        return dg.Definitions(jobs=[build_lean_job(job, tables, settings, names=names)],
                              resources=resource_defs)
    jobs = build_jobs(tables, settings, names=names)
    maintenance = build_maintenance_job(tables, names)
    incremental, incremental_job = build_incremental(tables, names=names)
    return dg.Definitions(
        assets=[*source_specs(tables, names),
                *build_capture_assets(tables, names), incremental],
        asset_checks=build_asset_checks(tables, settings, names=names),
        jobs=[*jobs.all(), incremental_job, build_signal_job(names),
              build_teardown_job(names), maintenance],
        schedules=[*build_schedules(jobs, settings, names=names),
                   build_maintenance_schedule(maintenance, settings, names=names)],
        sensors=[*build_sensors(tables, jobs, settings, names=names),
                 build_signal_sensor(tables, incremental_job, names=names)],
        resources=resource_defs,
    )


@dg.definitions
def defs() -> dg.Definitions:
    """Definitions resolved from the environment (PGCDC_PG_DSN, PGCDC_TABLES, ...)."""
    dsn = os.environ.get("PGCDC_PG_DSN")
    if not dsn:
        raise ConfigurationError(
            "PGCDC_PG_DSN is not set: export the libpq connection string of the source "
            "database, e.g. PGCDC_PG_DSN='host=127.0.0.1 port=5432 dbname=app user=cdc'.")
    environment = _pgcdc_environment()
    tables = _discovered(environment)
    return _built(tables, environment)


@lru_cache(maxsize=1)
def _discovered(environment: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The captured tables, read from the source catalog once per process and environment.

    Dagster reconstructs the code location four to six times within one `dagster job
    execute`; each reconstruction would otherwise reconnect, re-read the catalog and repeat
    the warning about tables left out. A reload (the UI's *Reload*, `dagster dev`, `dagster
    code-server start`) starts a new code-server process, which reads the catalog again.
    """
    env = dict(environment)
    include = split_list(env.get("PGCDC_TABLES", ""))

    def discover() -> list[tuple[str, str]]:
        return discover_tables(env["PGCDC_PG_DSN"], include,
                               plugin=env.get("PGCDC_PLUGIN_NAME") or PGOUTPUT)

    # A source that does not answer never fails the load (the tables cached in
    # PGCDC_CATALOG, or none): capture runs fail naming it instead.
    return tuple(resolve_tables(discover, env.get("PGCDC_CATALOG") or None,
                                f"({describe_dsn(env['PGCDC_PG_DSN'])})"))


def _pgcdc_environment() -> tuple[tuple[str, str], ...]:
    """The ``PGCDC_*`` variables: what the definitions' settings and resources are made of."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PGCDC_")))


@lru_cache(maxsize=1)
def _built(tables: tuple[tuple[str, str], ...],
           environment: tuple[tuple[str, str], ...]) -> dg.Definitions:
    """:func:`build_definitions` of the environment, once per tables and environment (a
    reload that finds other tables, or another environment, builds them again). A process
    started to execute one lean job (``dagster job execute -j cdc_microbatch``, or the run
    worker of such a run: :func:`~pgcdc_dagster.run_process.job_of_process`) builds that
    job only (its cost does not grow with the captured tables' definitions)."""
    del environment  # part of the cache key only: build_definitions reads os.environ
    return build_definitions(tables, job=job_of_process(sys.argv, os.environ))


__all__ = ["CAPTURE_POOL", "build_definitions", "defs", "discover_capture", "discover_tables"]
