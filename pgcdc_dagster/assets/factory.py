"""``pgcdc_definitions``: one capture (a source database, its slot, its lakehouse) as Dagster
definitions that merge with a project's own and with other captures'.

    import dagster as dg
    from pgcdc_dagster import PgcdcTranslator, pgcdc_definitions
    from pgcdc_dagster.resources import CaptureResource, LakehouseResource, PostgresResource

    app = pgcdc_definitions(
        name="app",
        postgres=PostgresResource(dsn=dg.EnvVar("APP_PG_DSN")),
        lakehouse=LakehouseResource(root="s3://lake/app"),
        capture=CaptureResource(slot="app_cdc", publication="app_cdc", topic_prefix="app"),
        tables=["public.orders", "public.customers"],
    )
    defs = dg.Definitions.merge(app, billing, dg.Definitions(assets=[my_report]))

Every name is the capture's own (:class:`~pgcdc_dagster.assets.naming.CaptureNames`); table
keys are the translator's (by default prefixed with the name: ``app/silver/public/orders``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from pgcdc_dagster.assets.catalog import parse_tables, resolve_tables
from pgcdc_dagster.assets.naming import CaptureNames
from pgcdc_dagster.assets.translator import PgcdcTranslator
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)
from pgcdc_dagster.resources.capture import split_list


def _resolved(resource: dg.ConfigurableResource) -> dict[str, Any]:  # type: ignore[type-arg]
    """The fields set on ``resource``, environment variables read (unset ones left out)."""
    out: dict[str, Any] = {}
    for name in resource.model_fields_set:
        value = getattr(resource, name)
        if isinstance(value, dg.EnvVar):
            value = value.get_value()
            if value is None:
                continue
        out[name] = value
    return out


def check_capture(capture: CaptureResource, where: str) -> None:
    """Refuse, when the definitions are built, settings a run would refuse (an unknown mode
    or plugin, a slot name PostgreSQL refuses, bad column options), naming the capture."""
    try:
        CaptureResource(**_resolved(capture)).settings("", "")
    except (ConfigurationError, ValueError) as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


def keep_configured(resource: dg.ConfigurableResource) -> Any:  # type: ignore[type-arg]
    """``resource`` bound so that run config naming some of its fields keeps the values the
    code gave the others (a plain resource resets every field the run config does not name to
    its default)."""
    values = {name: getattr(resource, name) for name in sorted(resource.model_fields_set)}
    return type(resource).configure_at_launch(**values)


def capture_tables(name: str, postgres: PostgresResource, capture: CaptureResource,
                   tables: Sequence[str | tuple[str, str]] | None,
                   catalog: str | Path | None) -> list[tuple[str, str]]:
    """The captured tables (:mod:`pgcdc_dagster.assets.catalog`): ``tables`` when given, else
    the include list resolved against the source, cached in ``catalog``."""
    if tables is not None:
        return parse_tables(tables)
    from pgcdc_dagster.definitions import discover_tables

    def discover() -> list[tuple[str, str]]:
        dsn = postgres.dsn.get_value() if isinstance(postgres.dsn, dg.EnvVar) else postgres.dsn
        if not dsn:
            raise ConfigurationError(f"capture {name!r}: the source DSN is not set (its "
                                     "environment variable is empty)")
        include = capture.tables
        if isinstance(include, dg.EnvVar):
            include = include.get_value() or ""
        return discover_tables(dsn, split_list(include), plugin=capture.plugin_name)

    return resolve_tables(discover, catalog, f"of capture {name!r}")


def pgcdc_definitions(*, name: str, postgres: PostgresResource,
                      lakehouse: LakehouseResource, capture: CaptureResource,
                      spark: SparkResource | None = None,
                      translator: PgcdcTranslator | None = None,
                      tables: Sequence[str | tuple[str, str]] | None = None,
                      catalog: str | Path | None = None,
                      settings: MonitorSettings | None = None) -> dg.Definitions:
    """The definitions of one capture, every name prefixed with ``name``.

    Args:
        name: the capture's name: a letter, then letters, digits or ``_``.
        postgres, lakehouse, capture, spark: its resources (bound as ``<name>_postgres``,
            ...). Run config that sets some of their fields keeps the others.
        translator: the table assets' specs; default prefixes every table key with ``name``.
        tables: the captured tables, ``schema.table``; the source is then never read when
            the code location loads. Without it, ``capture.tables`` (the include list) is
            resolved against the source, and cached in ``catalog`` for loads while the
            source is down.
        settings: schedules, sensor thresholds, check limits, owners (default: the
            ``PGCDC_*`` variables of docs/configuration.md).

    Raises:
        ConfigurationError: a setting a run would refuse, named with the capture.
    """
    names = CaptureNames(name)  # checks the name
    if not name:
        raise ConfigurationError("pgcdc_definitions: name is required (e.g. name='app'): it "
                                 "keeps this capture's names apart from any other's")
    check_capture(capture, f"capture {name!r}")
    found = capture_tables(name, postgres, capture, tables, catalog)
    from pgcdc_dagster.definitions import build_definitions

    return build_definitions(
        found, {key: keep_configured(resource) for key, resource in (
            ("postgres", postgres), ("lakehouse", lakehouse), ("capture", capture),
            ("spark", spark if spark is not None else SparkResource()))},
        settings=settings if settings is not None else MonitorSettings.from_env(os.environ),
        name=names.name,
        translator=translator if translator is not None else PgcdcTranslator(
            key_prefix=[name]))


__all__ = ["keep_configured", "pgcdc_definitions"]
