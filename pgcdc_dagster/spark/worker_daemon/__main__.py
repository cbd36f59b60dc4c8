"""``python -m pgcdc_dagster.spark.worker_daemon``: preload, then run pyspark's daemon."""

from __future__ import annotations

from pgcdc_dagster.spark.worker_daemon import preload

if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
