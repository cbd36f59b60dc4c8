"""This repository's code location: the resources of the installed package, re-exported.

The wheel installs ``pgcdc_dagster`` only; a project of your own imports
``pgcdc_dagster.resources`` (or uses :func:`pgcdc_dagster.pgcdc_definitions`).
"""

from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

__all__ = ["CaptureResource", "LakehouseResource", "PostgresResource", "SparkResource"]
