"""Runs one capture round in a child process, so a test can kill it at a crash point.

    python -m tests.support.crash_runner DSN LAKEHOUSE SLOT [silver] [arrow-silver]
        [silver-batch-rows=N]

``arrow-silver``: silver without a Spark session (batches below the Spark threshold).
"""

from __future__ import annotations

import sys

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings


def main(argv: list[str]) -> None:
    dsn, lakehouse, slot = argv[:3]
    batch = [int(a.split("=", 1)[1]) for a in argv[3:] if a.startswith("silver-batch-rows=")]
    settings = CaptureSettings(dsn=dsn, lakehouse=lakehouse, include=("public\\..*",),
                               slot=slot, publication=slot, window_max_bytes=1 << 20,
                               **({"silver_batch_rows": batch[0]} if batch else {}))
    spark = None
    if "silver" in argv[3:]:
        from pgcdc_dagster.spark.session import build_session

        spark = build_session()
    run_bronze(settings, spark, force_snapshot_step=False)  # type: ignore[arg-type]
    if spark is not None or "arrow-silver" in argv[3:]:
        run_silver(settings, spark)  # type: ignore[arg-type]


if __name__ == "__main__":
    main(sys.argv[1:])
