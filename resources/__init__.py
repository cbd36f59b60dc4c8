"""Dagster resources: the source PostgreSQL, Spark, the lakehouse and the capture settings."""

from resources.capture import CaptureResource
from resources.lakehouse import LakehouseResource
from resources.postgres import PostgresResource
from resources.spark import SparkResource

__all__ = ["CaptureResource", "LakehouseResource", "PostgresResource", "SparkResource"]
