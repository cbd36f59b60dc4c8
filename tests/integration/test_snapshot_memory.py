"""A snapshot chunk several times larger than the memory given to it completes.

The chunk runs exactly as a Spark task runs it (``run_chunk``) in a child process whose
data segment is capped with ``RLIMIT_DATA`` (heap and anonymous mappings) at its size after
start-up plus ``HEADROOM_MB``; the table's COPY output is five times that. The child uses the
system allocator with a fixed mmap threshold (``ARROW_DEFAULT_MEMORY_POOL=system``,
``MALLOC_MMAP_THRESHOLD_``) so that freed buffers leave the data segment at once: mimalloc's
reservations and glibc's adaptive threshold would measure the allocator, not the snapshot.
A second child with a tiny headroom must fail, which shows the cap binds.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.lake.delta import ensure_table
from pgcdc_dagster.postgres.chunk_plan import key_columns, table_size
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.snapshot_read import Chunk, block_bytes
from pgcdc_dagster.spark.snapshot_tasks import ChunkTask

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
HEADROOM_MB = 176
ROWS = 230_000
BODY = 128  # x 32 hex chars: 4 KiB of text per row (stored compressed by TOAST)


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(f.read().split(key + ":")[1].split()[0]) * 1024


def _child(task_path: Path, headroom_mb: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ARROW_DEFAULT_MEMORY_POOL="system", MALLOC_MMAP_THRESHOLD_="131072")
    return subprocess.run([sys.executable, "-m", "tests.integration.test_snapshot_memory",
                           str(task_path), str(headroom_mb)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_chunk_larger_than_its_memory_completes(pg_dsn, pg_conn, lakehouse, tmp_path) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE wide (id int PRIMARY KEY, body text, n numeric(12,2), "
                    "at timestamptz)")
        cur.execute(f"INSERT INTO wide SELECT g, repeat(md5(g::text), {BODY}), g / 3.0, "
                    f"now() FROM generate_series(1, {ROWS}) g")
        cur.execute("ANALYZE wide")
        cur.execute("SELECT sum(octet_length(body))::bigint FROM wide")
        text_bytes = cur.fetchone()[0]
    assert text_bytes >= 5 * (HEADROOM_MB << 20)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse))
    ctx = load_contexts(settings)[0]
    ensure_table(ctx.bronze_uri, ctx.bronze_schema)
    ensure_table(ctx.silver_uri, ctx.silver_schema)
    with connection(pg_dsn) as conn:
        size = table_size(conn, "public", "wide")
        key = tuple(key_columns(conn, "public", "wide"))
    task = ChunkTask(pg_dsn, None, Chunk("public", "wide", 0), ctx.relation, ctx.converters,
                     ctx.bronze_schema, ctx.silver_schema, key, None, ctx.bronze_uri,
                     ctx.silver_uri, SourceIdentity("mem", "db"), 1, int(time.time() * 1000),
                     block_size=block_bytes(settings.snapshot_fetch_size, size.row_bytes))
    task_path = tmp_path / "task.pkl"
    task_path.write_bytes(pickle.dumps(task))

    starved = _child(task_path, 16)
    assert starved.returncode != 0, starved.stdout
    assert re.search(r"Memory|alloc|Resource temporarily unavailable", starved.stderr), \
        starved.stderr[-2000:]

    proc = _child(task_path, HEADROOM_MB)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == ROWS
    for root in (ctx.bronze_uri, ctx.silver_uri):
        assert pq.read_metadata(f"{root}/{result['files'][0]}").num_rows == ROWS


def main(argv: list[str]) -> None:
    """Child: cap the data segment, then run the chunk as a Spark worker would."""
    from pgcdc_dagster.spark.snapshot_tasks import run_chunk

    task = pickle.loads(Path(argv[0]).read_bytes())
    limit = _status("VmData") + (int(argv[1]) << 20)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    result = run_chunk(task)
    assert result.error is None, result.error
    assert result.bronze is not None and result.silver is not None
    print(json.dumps({"rows": result.rows, "files": [result.bronze.path],
                      "peak_rss": _status("VmHWM")}))


if __name__ == "__main__":
    main(sys.argv[1:])
