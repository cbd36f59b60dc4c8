"""The code location's start-up (issue 16): no garbage collection while it is imported, what
the import created frozen out of the collector's reach, Arrow's own allocations on jemalloc
(mimalloc kept tens of MiB after a micro-batch), a user's ARROW_DEFAULT_MEMORY_POOL kept.

Each case imports ``pgcdc_dagster.definitions`` in a fresh interpreter, as ``dagster job
execute -m pgcdc_dagster.definitions`` does (nothing of the project or pyarrow loaded before).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import gc, json, sys, tempfile
collections = []
gc.callbacks.append(lambda phase, info: phase == "stop" and "pgcdc_dagster.startup"
                    in sys.modules and collections.append(info))  # from the start-up on
import pgcdc_dagster.definitions
during_import = len(collections)
import pyarrow as pa, pyarrow.parquet as pq
path = tempfile.mktemp(suffix=".parquet")
pq.write_table(pa.table({"n": list(range(100_000)), "s": ["x" * 20] * 100_000}), path)
assert pq.read_table(path).num_rows == 100_000  # Parquet internals allocate in Arrow's pool
print(json.dumps({
    "collections_during_import": during_import, "gc_enabled": gc.isenabled(),
    "frozen": gc.get_freeze_count(), "pool": pa.default_memory_pool().backend_name,
    "mimalloc_max": pa.mimalloc_memory_pool().max_memory(),
    "jemalloc_max": pa.jemalloc_memory_pool().max_memory()}))
"""


def _probe(**env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_import_pauses_the_collector_and_arrow_allocates_with_jemalloc() -> None:
    got = _probe()
    assert got["collections_during_import"] == 0
    assert got["gc_enabled"] is True  # resumed after the import
    assert isinstance(got["frozen"], int) and got["frozen"] > 100_000  # Dagster's and ours
    assert got["pool"] == "jemalloc"
    assert got["mimalloc_max"] == 0 and isinstance(got["jemalloc_max"], int) \
        and got["jemalloc_max"] > 0


def test_a_users_arrow_pool_is_kept() -> None:
    got = _probe(ARROW_DEFAULT_MEMORY_POOL="system")
    assert got["pool"] == "system"
    assert got["gc_enabled"] is True
