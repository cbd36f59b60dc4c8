"""Dagster resources: the source PostgreSQL, Spark, the lakehouse and the capture settings."""

from pgcdc_dagster.resources.capture import CaptureResource
from pgcdc_dagster.resources.lakehouse import LakehouseResource
from pgcdc_dagster.resources.postgres import PostgresResource
from pgcdc_dagster.resources.spark import SparkResource

__all__ = ["CaptureResource", "LakehouseResource", "PostgresResource", "SparkResource"]
