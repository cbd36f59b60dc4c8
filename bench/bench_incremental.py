"""Incremental snapshot rows/s against the raw COPY rate of the same table, with and without
concurrent writes, for a few chunk sizes (``incremental.snapshot.chunk.size``).

    .venv/bin/python -m bench.bench_incremental [rows] [repeats] [size,size,...]

Each configuration runs ``repeats`` times (the machine is shared: the load average is printed
with every figure, and the median per configuration at the end).
"""

from __future__ import annotations

import io
import os
import shutil
import statistics
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


SIZES = (1024, 8192, 32768, 65536, 131072)


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(rows: int, repeats: int = 1, sizes: tuple[int, ...] = SIZES) -> None:
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
        print(f"raw COPY: {raw:,.0f} rows/s ({load()})", flush=True)
        rates: dict[tuple[int, bool], list[float]] = {}
        runs = [(r, c, s) for r in range(repeats) for c in (False, True) for s in sizes]
        for rep, concurrent, size in runs:
            settings = CaptureSettings(dsn=cluster.dsn,
                                       lakehouse=str(root / f"lake{size}-{rep}"),
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
            rates.setdefault((size, concurrent), []).append(rate)
            print(f"[{rep + 1}/{repeats}, {load()}] "
                  f"chunk {size:>6} writes={'on ' if concurrent else 'off'}: "
                  f"{rate:,.0f} rows/s = {rate / raw:.1%} of raw COPY "
                  f"(emitted {report.tables[0].rows_emitted}, superseded "
                  f"{report.tables[0].rows_dropped}; chunk reads (on the reader "
                  f"thread, overlapping the windows) {report.read_seconds / seconds:.0%} "
                  f"of the wall time; {report.tables[0].rows_read / cpu:,.0f} rows per "
                  "CPU-second of this process, less sensitive to the machine's load)",
                  flush=True)
        print(f"median rows/s over {repeats} run(s) ({load()}):")
        for (size, concurrent), values in sorted(rates.items()):
            med = statistics.median(values)
            print(f"  chunk {size:>6} writes={'on ' if concurrent else 'off'}: {med:,.0f} "
                  f"= {med / raw:.1%} of raw COPY (min {min(values):,.0f}, "
                  f"max {max(values):,.0f})")
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000,
         int(sys.argv[2]) if len(sys.argv) > 2 else 1,
         tuple(int(x) for x in sys.argv[3].split(",")) if len(sys.argv) > 3 else SIZES)
