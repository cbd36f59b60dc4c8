"""What a Spark Python worker imports to run snapshot chunks (a cold worker's
imports are paid before the first chunk): the task modules, not the Delta writer
(``deltalake``, the commit-safety checks, the S3 signer): the driver commits, a task never
does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import json, sys
import pgcdc_dagster.spark.chunk_jobs, pgcdc_dagster.spark.snapshot_tasks
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "deltalake"
                        or m in ("pgcdc_dagster.lake.delta", "pgcdc_dagster.lake.commit_safety"))))
"""


def test_snapshot_task_modules_do_not_import_the_delta_writer() -> None:
    proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
