"""Slot-read benchmark: our pgoutput decoding end to end against PostgreSQL's raw peek rate.

For one window of N changes (default 1,000,000: INSERT ... SELECT generate_series
transactions of 100k rows, then UPDATEs of the same rows) in a fresh LocalCluster it prints:

* raw peek rate: ``COPY (SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes(...))
  TO STDOUT (FORMAT binary)`` into a byte-counting sink (PostgreSQL alone, the limit);
* our end-to-end rate: the same COPY through ``peek_window`` (incremental COPY parsing,
  pgoutput decoding, assembled ``Window``) plus an Arrow table per segment (the raw value
  bytes as binary columns, the event metadata as integer/string columns);
* their ratio (target: >= 0.5 on 2 cores);
* the same end to end with ``peek_window(..., portion_changes=--portion, on_portion=...)``
  turning each portion into Arrow while the COPY still streams, as the stream does with
  bronze (bounded memory; the Arrow work overlaps PostgreSQL's). ``--portion 0`` skips it.

Runs alternate raw/ours ``--repeat`` times after a warm-up; best and median are printed.
``--bronze`` also times the project's typed bronze builder (``cdc.envelope``) per segment,
for information. Timings on a shared machine are noisy: the load average is printed.

    .venv/bin/python bench/bench_slot_read.py [--changes N] [--repeat R] [--portion P]
        [--varied] [--bronze]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg2
import pyarrow as pa

from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST, TableChanges, Window
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.pgoutput.options import choose_options
from pgcdc_dagster.cdc.plugins import PLUGINS
from pgcdc_dagster.postgres.local_cluster import LocalCluster
from pgcdc_dagster.postgres.peek import build_peek_query, peek_window
from pgcdc_dagster.postgres.plugin_peek import build_plugin_peek_query, peek_plugin_window

PLUGIN = "pgoutput"

BATCH = 100_000
TABLE = ("CREATE TABLE src (id int PRIMARY KEY, name text, amount numeric(12,2), "
         "updated_at timestamptz, payload jsonb)")


class CountingSink:
    """COPY target that only counts bytes (what the raw rate is measured with)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.rows = 0

    def write(self, data: bytes) -> None:
        self.bytes += len(data)
        self.rows += 1


def _image_columns(rows: list, names: list[str], prefix: str) -> dict[str, pa.Array]:
    """One binary column per table column; None rows (no image) become nulls.

    All columns are built in one pass (the tuples as a struct array, then its fields), which
    is about twice as fast as one ``pa.array`` per column over ``itemgetter`` lists.
    """
    if rows.count(None) == len(rows):
        return {}
    kind = pa.struct([(f"c{j}", pa.binary()) for j in range(len(names))])
    try:
        struct = pa.array(rows, kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # unchanged TOAST values: nulls here
        struct = pa.array([r if r is None else tuple(None if v is UNCHANGED_TOAST else v
                                                     for v in r) for r in rows], kind)
    return {prefix + name: array for name, array in zip(names, struct.flatten(), strict=True)}


def segment_to_arrow(seg: TableChanges) -> pa.Table:
    """The segment's events as Arrow: metadata columns plus raw before/after value bytes."""
    names = [c.name for c in seg.relation.columns]
    columns: dict[str, pa.Array] = {
        "op": pa.array(seg.op),  # inferred: ~9x faster than an explicit pa.string()
        "commit_lsn": pa.array(seg.commit_lsn, pa.uint64()),
        "lsn": pa.array(seg.lsn, pa.uint64()),
        "xid": pa.array(seg.xid, pa.uint32()),
        "commit_ts_us": pa.array(seg.commit_ts_us, pa.int64()),
        "total_order": pa.array(seg.total_order, pa.int64()),
        "collection_order": pa.array(seg.collection_order, pa.int64()),
    }
    columns.update(_image_columns(seg.after, names, "after."))
    columns.update(_image_columns(seg.before, names, "before."))
    return pa.table(columns)


def window_to_arrow(window: Window) -> list[pa.Table]:
    return [segment_to_arrow(seg) for seg in window.segments()]


def prepare(dsn: str, changes: int, varied: bool = False, plugin: str = "pgoutput") -> Lsn:
    """Create the table, publication and slot, then write ``changes`` changes.

    ``varied``: value lengths change from row to row (text of 0-22 extra characters, amounts
    of varying digits), so the learnt row layouts rarely apply: the per-column parse path.
    """
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute(TABLE)
    cur.execute("CREATE PUBLICATION bench_pub FOR TABLE src")
    cur.execute("SELECT pg_create_logical_replication_slot('bench_slot', %s)", (plugin,))
    inserts = changes // 2
    started = time.monotonic()
    for lo in range(1, inserts + 1, BATCH):
        hi = min(lo + BATCH - 1, inserts)
        name = "'name ' || repeat('x', (g::bigint * 7919 %% 23)::int)" if varied else "'name ' || g"
        cur.execute(f"INSERT INTO src SELECT g, {name}, g * 1.5, now(), "
                    "jsonb_build_object('k', g, 'tag', 't' || (g %% 10)) "
                    "FROM generate_series(%s, %s) g", (lo, hi))
    updates = changes - inserts
    for lo in range(1, updates + 1, BATCH):
        hi = min(lo + BATCH - 1, updates)
        amount = "amount * (id::bigint * 7919 %% 1000)" if varied else "amount + 1"
        cur.execute(f"UPDATE src SET amount = {amount}, updated_at = now() "
                    "WHERE id BETWEEN %s AND %s", (lo, hi))
    cur.execute("CHECKPOINT")
    cur.execute("SELECT pg_current_wal_flush_lsn()::text")
    upto = Lsn(cur.fetchone()[0])
    print(f"workload: {changes:,} changes written in {time.monotonic() - started:.1f} s; "
          f"window upto {upto}")
    conn.close()
    return upto


class Clock:
    """Wall time, this process's CPU and the PostgreSQL backend's CPU (from /proc)."""

    def __init__(self, backend_pid: int) -> None:
        self._stat = Path(f"/proc/{backend_pid}/stat")
        self._tick = os.sysconf("SC_CLK_TCK")

    def backend_cpu(self) -> float:
        try:
            fields = self._stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / self._tick

    def now(self) -> tuple[float, float, float]:
        return time.perf_counter(), time.process_time(), self.backend_cpu()


def _since(clock: Clock, start: tuple[float, float, float]) -> tuple[float, float, float]:
    end = clock.now()
    return end[0] - start[0], end[1] - start[1], end[2] - start[2]


def raw_peek(conn, query, clock: Clock) -> tuple[tuple[float, float, float], CountingSink]:
    sink = CountingSink()
    start = clock.now()
    with conn.cursor() as cur:
        cur.copy_expert(query, sink)
    return _since(clock, start), sink


def _peek(conn, upto: Lsn, **kw):
    """Our window read with the benchmark's plugin (``--plugin``)."""
    if PLUGIN == "pgoutput":
        return peek_window(conn, "bench_slot", "bench_pub", upto, **kw)
    return peek_plugin_window(conn, PLUGIN, "bench_slot", "bench_pub", upto, **kw)


def ours(conn, upto: Lsn, clock: Clock):
    start = clock.now()
    window = _peek(conn, upto)
    decoded = _since(clock, start)
    start = clock.now()
    tables = window_to_arrow(window)
    return decoded, _since(clock, start), window, tables


def ours_in_portions(conn, upto: Lsn, clock: Clock, portion: int):
    """End to end with each portion turned into Arrow as soon as it is handed out."""
    tables: list[pa.Table] = []
    start = clock.now()
    window = _peek(conn, upto, portion_changes=portion,
                         on_portion=lambda part: tables.extend(window_to_arrow(part)))
    tables.extend(window_to_arrow(window))
    return _since(clock, start), window, tables


def bronze(conn, window: Window) -> float:
    """Typed Debezium bronze rows through the project's converters (informational)."""
    from pgcdc_dagster.capture.tables import converters_for
    from pgcdc_dagster.cdc.envelope import SourceIdentity, bronze_from_changes
    from pgcdc_dagster.cdc.typeconv import TypeModes
    from pgcdc_dagster.postgres.catalog import load_types

    started = time.perf_counter()
    ident = SourceIdentity("bench", "postgres")
    for seg in window.segments():
        types = load_types(conn, {c.type_oid for c in seg.relation.columns})
        convs = converters_for(seg.relation.columns, types, TypeModes())
        bronze_from_changes(seg, convs, ident, int(time.time() * 1000))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--portion", type=int, default=100_000,
                        help="portion_changes of the portioned variant (0: skip it)")
    parser.add_argument("--varied", action="store_true",
                        help="value lengths vary row to row (learnt layouts rarely apply)")
    parser.add_argument("--bronze", action="store_true",
                        help="also time typed bronze conversion (cdc.envelope)")
    parser.add_argument("--plugin", default="pgoutput", choices=PLUGINS,
                        help="plugin.name of the slot (raw peek is that plugin's own rate)")
    args = parser.parse_args()
    global PLUGIN
    PLUGIN = args.plugin
    root = Path(tempfile.mkdtemp(prefix="pgcdc-bench-slot-"))
    cluster = LocalCluster(root / "pg").start()
    try:
        upto = prepare(cluster.dsn, args.changes, args.varied, args.plugin)
        conn = psycopg2.connect(cluster.dsn)
        conn.autocommit = True
        options = choose_options(conn.server_version, ("bench_pub",))
        query = build_peek_query("bench_slot", upto, options) if PLUGIN == "pgoutput" \
            else build_plugin_peek_query(PLUGIN, "bench_slot", upto)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            clock = Clock(cur.fetchone()[0])
        cold, sink = raw_peek(conn, query, clock)
        rows = sink.rows - 1  # the trailer is the last CopyData message
        print(f"window: {rows:,} slot rows, {sink.bytes / 1e6:.1f} MB COPY binary; "
              f"cold raw peek {cold[0]:.2f} s; pgoutput proto {options.proto_version}")
        raw, decode, arrow, portioned = [], [], [], []
        changes = 0
        for _ in range(args.repeat):
            raw.append(raw_peek(conn, query, clock)[0])
            gc.collect()
            decoded, converted, window, tables = ours(conn, upto, clock)
            decode.append(decoded)
            arrow.append(converted)
            changes = window.change_count
            assert sum(t.num_rows for t in tables) == changes
            del window, tables
            gc.collect()
            if args.portion:
                timed, window, tables = ours_in_portions(conn, upto, clock, args.portion)
                portioned.append(timed)
                assert sum(t.num_rows for t in tables) == window.change_count == changes
                del window, tables
                gc.collect()
        total = [(d[0] + a[0], d[1] + a[1], d[2] + a[2]) for d, a in zip(decode, arrow,
                                                                        strict=True)]
        print(f"changes in window: {changes:,}  (cpus: {os.cpu_count()}, load average: "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})")
        print(f"{'':34s}{'wall best':>10s}{'changes/s':>11s}{'median':>8s}"
              f"{'py cpu':>8s}{'pg cpu':>8s}")
        rows_out = [("raw peek (PostgreSQL alone)", raw),
                    ("ours: peek + decode + Window", decode),
                    ("ours: Arrow per segment", arrow),
                    ("ours: end to end", total)]
        if portioned:
            rows_out.append((f"ours: end to end, portions {args.portion // 1000}k", portioned))
        for label, runs in rows_out:
            best = min(r[0] for r in runs)
            median = statistics.median(r[0] for r in runs)
            py = min(r[1] for r in runs)
            pg = min(r[2] for r in runs)
            print(f"{label:34s}{best:9.2f}s{changes / best:>11,.0f}{median:7.2f}s"
                  f"{py:7.2f}s{pg:7.2f}s")
        best_ratio = min(r[0] for r in raw) / min(t[0] for t in total)
        median_ratio = (statistics.median(r[0] for r in raw)
                        / statistics.median(t[0] for t in total))
        print(f"ratio ours/raw (wall): best {best_ratio:.2f}, median {median_ratio:.2f} "
              f"(target >= 0.5)")
        if portioned:
            raw_median = statistics.median(r[0] for r in raw)
            print(f"ratio ours/raw (wall), in portions of {args.portion:,}: best "
                  f"{min(r[0] for r in raw) / min(t[0] for t in portioned):.2f}, median "
                  f"{raw_median / statistics.median(t[0] for t in portioned):.2f}")
        # On an idle 2-core machine the server and our process run side by side: the COPY
        # takes as long as the slower of the two, then the Arrow step runs alone.
        raw_idle = min(max(r[1], r[2]) for r in raw)
        ours_idle = min(max(d[1], d[2]) + a[1] for d, a in zip(decode, arrow, strict=True))
        print(f"ratio from CPU times (idle 2-core estimate): {raw_idle / ours_idle:.2f} "
              f"(raw {raw_idle:.2f} s, ours {ours_idle:.2f} s)")
        if args.bronze:
            _, _, window, _ = ours(conn, upto, clock)
            seconds = bronze(conn, window)
            print(f"typed bronze (cdc.envelope, informational): {seconds:.2f} s = "
                  f"{changes / seconds:,.0f} changes/s on top")
        conn.close()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)  # ~400 MB of WAL and data per run


if __name__ == "__main__":
    sys.exit(main())
