"""Incremental snapshots: DBLog chunks between watermarks while the stream runs.

Writers change the table being snapshotted (inserts, updates leaving a TOASTed column
unchanged, primary-key changes, deletes); afterwards silver equals the source exactly. One
table is added to the capture after the initial snapshot, so its rows reach silver only
through the incremental snapshot; one of its TOAST values exists only in a chunk.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture import incremental
from pgcdc_dagster.capture.faults import ENV
from pgcdc_dagster.capture.incremental import apply_signal, run_incremental
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.capture.stream import run_windows
from pgcdc_dagster.cdc.dblog import parse_signal
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.postgres.connection import connect
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300))"
BASE = f"""
CREATE TABLE base (id int PRIMARY KEY, n int, doc text);
ALTER TABLE base ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO base SELECT g, g, CASE WHEN g % 10 = 0 THEN {BIG} ELSE 'd' || g END
    FROM generate_series(1, 400) g;
"""
LATE = f"""
CREATE TABLE late (a int, b text, n int, doc text, PRIMARY KEY (a, b));
ALTER TABLE late ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO late SELECT g, 'k' || (g % 3), g, CASE WHEN g % 7 = 0 THEN {BIG} ELSE 'x' || g END
    FROM generate_series(1, 300) g;
"""


def settings_for(dsn: str, lakehouse: Path, include: str = r"public\.(base|late)",
                 slot: str = "inc") -> CaptureSettings:
    return CaptureSettings(dsn=dsn, lakehouse=str(lakehouse), include=(include,), slot=slot,
                           publication=slot, window_max_bytes=4 << 20)


def micro_batch(settings: CaptureSettings) -> None:
    contexts = load_contexts(settings)
    with connect(settings.dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_database()")
        db = cur.fetchone()[0]
    run_windows(dataclasses.replace(settings, max_windows=5), contexts,
                SourceIdentity(settings.topic_prefix, db))


def start(pg_conn, pg_dsn: str, lakehouse: Path, spark, slot: str = "inc") -> CaptureSettings:
    """Initial snapshot of ``base`` only; then ``late`` appears and joins the capture."""
    with pg_conn.cursor() as cur:
        cur.execute(BASE)
    first = settings_for(pg_dsn, lakehouse, r"public\.base", slot)
    run_bronze(first, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute(LATE)
    settings = settings_for(pg_dsn, lakehouse, slot=slot)
    micro_batch(settings)  # adds late to the publication; its old rows are not streamed
    return settings


def bronze_ops(lakehouse: Path, table: str) -> dict[str, int]:
    data = DeltaTable(table_uri(str(lakehouse), "bronze", "public", table)).to_pyarrow_table(
        columns=["op", "source"])
    out: dict[str, int] = {}
    for op, snap in zip(data["op"].to_pylist(),
                        pc.struct_field(data["source"], "snapshot").to_pylist(), strict=True):
        k = f"{op}:{snap}" if op == "r" else op
        out[k] = out.get(k, 0) + 1
    return out


def check(pg_conn, lakehouse: Path) -> None:
    for table, key in (("base", ["id"]), ("late", ["a", "b"])):
        assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public",
                                                       table), "public", table, key)


def test_window_dedup_and_toast_trap(pg_dsn, pg_conn, spark, lakehouse, monkeypatch) -> None:
    """Changes committed inside chunk windows, deterministically: before the chunk read
    (the chunk sees them; an unchanged-TOAST update of a row whose only copy is the chunk's),
    and after it (the chunk row is stale and must give way)."""
    settings = start(pg_conn, pg_dsn, lakehouse, spark)
    real = incremental.read_chunk
    calls: dict[str, int] = {}

    def racing_read(dsn, spec, after, upto, limit):  # type: ignore[no-untyped-def]
        calls[spec.table] = n = calls.get(spec.table, 0) + 1
        with pg_conn.cursor() as cur:
            if spec.table == "late" and n == 1:
                # inside the window, before the read: only the chunk has late's TOAST values
                cur.execute("UPDATE late SET n = n + 1000 WHERE a IN (7, 14, 21)")
                cur.execute("UPDATE late SET b = 'zz' WHERE a = 28")  # key change, TOAST kept
                cur.execute("DELETE FROM late WHERE a = 2")
        out = real(dsn, spec, after, upto, limit)
        with pg_conn.cursor() as cur:
            if spec.table == "late" and n == 1:
                # inside the window, after the read: the chunk rows are stale
                cur.execute("UPDATE late SET n = -1 WHERE a IN (3, 4, 5)")
                cur.execute("DELETE FROM late WHERE a = 6")
                cur.execute("INSERT INTO late VALUES (1, 'zz', 1, 'new')")
            if spec.table == "base" and n == 3:
                cur.execute("UPDATE base SET n = n + 1 WHERE id IN (10, 20, 11)")
                cur.execute("TRUNCATE base")
                cur.execute("INSERT INTO base VALUES (1, 1, 'after truncate')")
        return out

    monkeypatch.setattr(incremental, "read_chunk", racing_read)
    outcome = apply_signal(settings, parse_signal(
        "s1", "execute-snapshot", '{"data-collections": ["public\\\\.late", "public.base"]}'),
        chunk_size=100)
    assert sorted(outcome.tables) == ["public.base", "public.late"]
    report = run_incremental(settings)
    run_silver(settings, spark)
    check(pg_conn, lakehouse)
    by_table = {t.table: t for t in report.tables}
    late = by_table["public.late"]
    assert late.status == "done" and late.chunks_done == 3
    assert late.rows_early >= 3  # the TOAST trap: emitted before the unchanged-TOAST updates
    assert late.rows_dropped >= 4
    ops = bronze_ops(lakehouse, "late")
    assert ops["r:incremental"] == late.rows_emitted
    assert "r:true" not in ops and "r:false" not in ops
    # base: its second chunk saw a TRUNCATE in its window: the whole chunk is dropped
    assert by_table["public.base"].status == "done"


def writer(dsn: str, seed: int, stop: threading.Event, counter: list[int],
           limit: int | None = 300) -> None:
    """Seeded transactions on base and late until ``limit`` (a bounded workload) or, with
    no limit, until ``stop`` is set (paced a little, so runs keep up)."""
    rng = random.Random(seed)
    conn = connect(dsn, autocommit=False)
    cur = conn.cursor()
    next_id = 100_000 + seed * 1_000_000
    while counter[0] < limit if limit is not None else not stop.is_set():
        if limit is None:
            time.sleep(0.005)
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            pick = rng.randrange(1, 400)
            if r < 0.2:
                next_id += 1
                cur.execute(f"INSERT INTO base VALUES (%s, 0, {BIG})", (next_id,))
            elif r < 0.45:
                cur.execute("UPDATE base SET n = n + 1 WHERE id = %s", (pick,))  # TOAST kept
            elif r < 0.55:
                cur.execute("UPDATE late SET n = n + 1 WHERE a = %s", (pick % 300,))
            elif r < 0.65:
                next_id += 1
                # Key changes of rows with TOASTed docs lose the doc in the stream itself
                # under REPLICA IDENTITY DEFAULT (docs/incremental.md, Limits).
                cur.execute("UPDATE base SET id = %s WHERE id = %s AND length(doc) < 2000",
                            (next_id, pick))
            elif r < 0.72:
                cur.execute("UPDATE late SET a = a + 100000 WHERE a = %s AND length(doc) < 2000",
                            (pick % 300,))
            elif r < 0.85:
                cur.execute("DELETE FROM base WHERE id = %s", (pick,))
            elif r < 0.92:
                cur.execute("DELETE FROM late WHERE a = %s", (pick % 300,))
            else:
                cur.execute(f"UPDATE base SET doc = {BIG} WHERE id = %s", (pick,))
        conn.commit()
        counter[0] += 1
    conn.close()


def in_window_updates(pg_dsn: str, monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """Make every chunk read update one of the rows it just read, right after the read and
    before the chunk's high watermark: a change inside the window to a buffered key, which
    the DBLog dedup must let supersede the (now stale) chunk row. Returns the counter of
    such in-window updates."""
    real = incremental.read_chunk
    done = [0]
    conn = connect(pg_dsn)

    def racing_read(dsn, spec, after, upto, limit):  # type: ignore[no-untyped-def]
        rows, last = real(dsn, spec, after, upto, limit)
        if rows:
            pos = {"base": [0], "late": [0, 1]}[spec.table]
            key = [rows[len(rows) // 2][p].decode() for p in pos]  # type: ignore[union-attr]
            where = "id = %s" if spec.table == "base" else "a = %s AND b = %s"
            with conn.cursor() as cur:
                cur.execute(f"UPDATE {spec.table} SET n = n + 7 WHERE {where}", key)
                done[0] += cur.rowcount
        return rows, last

    monkeypatch.setattr(incremental, "read_chunk", racing_read)
    return done


def test_concurrent_writers_converge(pg_dsn, pg_conn, spark, lakehouse, monkeypatch) -> None:
    """INC-06/07/10: writers run through the snapshot; besides the background writer, every
    chunk has a change to one of its keys inside its window, so the dedup path runs on
    every chunk (superseded rows counted), and silver converges."""
    settings = start(pg_conn, pg_dsn, lakehouse, spark)
    stop = threading.Event()
    counter = [0]
    thread = threading.Thread(target=writer, args=(pg_dsn, 7, stop, counter))
    thread.start()
    in_window = in_window_updates(pg_dsn, monkeypatch)
    try:
        micro_batch(settings)
        apply_signal(settings, parse_signal("s1", "execute-snapshot",
                                            {"data-collections": ["public\\..*"]}),
                     chunk_size=37)
        report = run_incremental(settings)
        run_silver(settings, spark)
        micro_batch(settings)
    finally:
        stop.set()
        thread.join()
    micro_batch(settings)
    run_silver(settings, spark)
    check(pg_conn, lakehouse)
    assert all(t.status == "done" for t in report.tables)
    chunks = sum(t.chunks_done for t in report.tables)
    assert chunks > 10
    # Chunks saw in-window changes to their keys (one per chunk, unless the writer deleted
    # the row first), and each such chunk row gave way to the change: superseded, or emitted
    # just before an unchanged-TOAST update (the TOAST trap).
    assert in_window[0] > chunks // 2
    assert sum(t.rows_dropped + t.rows_early for t in report.tables) >= in_window[0]


def child(argv: list[str]) -> None:
    dsn, lakehouse = argv[:2]
    run_incremental(settings_for(dsn, Path(lakehouse)))


@pytest.mark.parametrize("point", ["incremental_after_chunk_read",
                                   "incremental_after_high_watermark",
                                   "after_bronze_commit", "incremental_after_progress"])
def test_killed_run_resumes(point, pg_dsn, pg_conn, spark, lakehouse, monkeypatch) -> None:
    """INC-04 (b): a run killed at each crash point resumes at the first chunk not committed,
    with writers running through the killed and the resumed run; silver converges."""
    settings = start(pg_conn, pg_dsn, lakehouse, spark)
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO late SELECT g, 'k', g, 'y' FROM generate_series(1000, 1400) g")
    apply_signal(settings, parse_signal("s1", "execute-snapshot",
                                        {"data-collections": ["public.late"]}), chunk_size=64)
    # Writers run through the killed run and the resumed one (INC-04: resumed without
    # losing data while the stream continues).
    stop = threading.Event()
    counter = [0]
    thread = threading.Thread(target=writer, args=(pg_dsn, 11, stop, counter, None))
    thread.start()
    try:
        env = dict(os.environ, **{ENV: point, "PYSPARK_PYTHON": sys.executable})
        proc = subprocess.run([sys.executable, "-m", "tests.integration.test_incremental",
                               pg_dsn, str(lakehouse)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == -signal.SIGKILL, (point, proc.returncode,
                                                    proc.stderr[-2000:])
        during_killed = counter[0]
        with pg_conn.cursor() as cur:
            cur.execute("UPDATE late SET n = n + 1 WHERE a % 5 = 0")
            cur.execute("DELETE FROM late WHERE a % 11 = 0")
        in_window = in_window_updates(pg_dsn, monkeypatch)
        report = run_incremental(settings)
        during_resumed = counter[0] - during_killed
    finally:
        stop.set()
        thread.join()
    assert during_killed > 0 and during_resumed > 0  # writes during both runs
    assert in_window[0] > 0  # and inside the resumed run's chunk windows
    micro_batch(settings)
    run_silver(settings, spark)
    check(pg_conn, lakehouse)
    late = next(t for t in report.tables if t.table == "public.late")
    assert late.status == "done"
    # resumed, not restarted: bronze holds each source row's READ about once
    ops = bronze_ops(lakehouse, "late")
    assert ops["r:incremental"] <= 701 + 64


if __name__ == "__main__":
    child(sys.argv[1:])
