"""Dagster asset definitions: thin wrappers around the capture engine."""

from pgcdc_dagster.assets.capture import CAPTURE_POOL, build_capture_assets, source_specs

__all__ = ["CAPTURE_POOL", "build_capture_assets", "source_specs"]
