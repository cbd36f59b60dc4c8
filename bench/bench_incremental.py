"""Incremental snapshot rows/s against the raw COPY rate of the same table, with and without
concurrent writes, for a few chunk sizes (``incremental.snapshot.chunk.size``).

    .venv/bin/python -m bench.bench_incremental [rows]
"""

from __future__ import annotations

import io
import sys
import tempfile
import threading
import time
from pathlib import Path

from pgcdc_dagster.capture.incremental import apply_signal, run_incremental
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.dblog import parse_signal
from pgcdc_dagster.postgres.connection import connect
from pgcdc_dagster.postgres.local_cluster import LocalCluster


def copy_rate(dsn: str, rows: int) -> float:
    conn = connect(dsn)
    t0 = time.perf_counter()
    with conn.cursor() as cur:
        cur.copy_expert("COPY (SELECT * FROM bench) TO STDOUT", io.BytesIO())
    conn.close()
    return rows / (time.perf_counter() - t0)


def writes(dsn: str, stop: threading.Event, rows: int) -> None:
    conn = connect(dsn)
    with conn.cursor() as cur:
        i = 0
        while not stop.is_set():
            cur.execute("UPDATE bench SET n = n + 1 WHERE id = %s", (1 + (i * 7919) % rows,))
            i += 1
    conn.close()


def main(rows: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-inc-"))
    cluster = LocalCluster(root / "pg").start()
    try:
        conn = connect(cluster.dsn)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE bench (id int PRIMARY KEY, n int, label text, "
                        "at timestamptz)")
            cur.execute("INSERT INTO bench SELECT g, g, md5(g::text), now() "
                        "FROM generate_series(1, %s) g", (rows,))
            cur.execute("ANALYZE bench")
            cur.execute("CREATE PUBLICATION b FOR TABLE bench")
            cur.execute("SELECT pg_create_logical_replication_slot('b', 'pgoutput')")
        raw = copy_rate(cluster.dsn, rows)
        print(f"raw COPY: {raw:,.0f} rows/s")
        for concurrent in (False, True):
            for size in (1024, 8192, 32768):
                settings = CaptureSettings(dsn=cluster.dsn, lakehouse=str(root / f"lake{size}"),
                                           include=(r"public\.bench",), slot="b",
                                           publication="b")
                apply_signal(settings, parse_signal("b", "execute-snapshot",
                                                    {"data-collections": ["public.bench"]}),
                             chunk_size=size)
                stop = threading.Event()
                thread = threading.Thread(target=writes, args=(cluster.dsn, stop, rows))
                if concurrent:
                    thread.start()
                t0, c0 = time.perf_counter(), time.process_time()
                report = run_incremental(settings)
                seconds = time.perf_counter() - t0
                cpu = time.process_time() - c0
                stop.set()
                if concurrent:
                    thread.join()
                rate = report.tables[0].rows_read / seconds
                print(f"chunk {size:>6} writes={'on ' if concurrent else 'off'}: "
                      f"{rate:,.0f} rows/s = {rate / raw:.1%} of raw COPY "
                      f"(emitted {report.tables[0].rows_emitted}, superseded "
                      f"{report.tables[0].rows_dropped}; chunk reads (on the reader "
                      f"thread, overlapping the windows) {report.read_seconds / seconds:.0%} "
                      f"of the wall time; {report.tables[0].rows_read / cpu:,.0f} rows per "
                      "CPU-second of this process, less sensitive to the machine's load)")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
