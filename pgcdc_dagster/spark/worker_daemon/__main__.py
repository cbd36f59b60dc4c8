"""``python -m pgcdc_dagster.spark.worker_daemon``: installed sources over Spark's zips;
hand the work to the zygote when there is one, else preload, then run pyspark's daemon."""

from __future__ import annotations

import os
import sys

from pgcdc_dagster.spark.worker_daemon import exit_now, installed_over_zips, preload

if __name__ == "__main__":
    sys.path[:] = installed_over_zips(sys.path)
    zygote = os.environ.get("PGCDC_WORKER_ZYGOTE")  # zygote.SOCKET_ENV
    if zygote:
        from pgcdc_dagster.spark.worker_daemon.zygote import hand_off

        status = hand_off(zygote, sys.path)
        if status is not None:
            sys.exit(status)
    preload()
    from pyspark.daemon import manager

    try:
        manager()
    except SystemExit as stop:  # pyspark's shutdown: its workers are told to end already
        exit_now(stop.code if isinstance(stop.code, int) else 1)
