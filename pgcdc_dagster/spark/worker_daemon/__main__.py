"""``python -m pgcdc_dagster.spark.worker_daemon``: installed sources over Spark's zips,
preload, then run pyspark's daemon."""

from __future__ import annotations

import sys

from pgcdc_dagster.spark.worker_daemon import installed_over_zips, preload

if __name__ == "__main__":
    sys.path[:] = installed_over_zips(sys.path)
    preload()
    from pyspark.daemon import manager

    manager()
