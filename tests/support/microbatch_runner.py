"""Runs the real ``cdc_microbatch`` job in a process of its own on the instance of
``DAGSTER_HOME`` (two at once: two run workers racing for one slot), and prints its run id
and outcome as one JSON line.

    python -m tests.support.microbatch_runner DSN LAKEHOUSE SLOT HEARTBEAT_QUERY
"""

from __future__ import annotations

import json
import sys

import dagster as dg

from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)


def main(argv: list[str]) -> None:
    dsn, lakehouse, slot, heartbeat = argv[:4]
    definitions = build_definitions([("public", "items")], {
        "postgres": PostgresResource(dsn=dsn),
        "lakehouse": LakehouseResource(root=lakehouse),
        "capture": CaptureResource(tables="public\\.items", slot=slot, publication=slot,
                                   heartbeat_action_query=heartbeat),
        "spark": SparkResource(),
    })
    with dg.DagsterInstance.get() as instance:
        result = definitions.resolve_job_def("cdc_microbatch").execute_in_process(
            instance=instance, raise_on_error=False)
    errors = [e.step_failure_data.error.to_string() for e in result.all_events
              if e.is_step_failure and e.step_failure_data.error is not None]
    print(json.dumps({"run_id": result.run_id, "success": result.success, "errors": errors}))


if __name__ == "__main__":
    main(sys.argv[1:])
