"""The Dagster layer: thin wrappers around the capture engine.

Its public entry points are :func:`~pgcdc_dagster.assets.factory.pgcdc_definitions`,
:class:`~pgcdc_dagster.assets.translator.PgcdcTranslator` and
:class:`~pgcdc_dagster.assets.component.PgcdcComponent` (re-exported by ``pgcdc_dagster``);
every name a capture defines comes from :class:`~pgcdc_dagster.assets.naming.CaptureNames`.
"""

from pgcdc_dagster.assets.capture import CAPTURE_POOL, build_capture_assets, source_specs

__all__ = ["CAPTURE_POOL", "build_capture_assets", "source_specs"]
