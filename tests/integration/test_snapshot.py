"""The initial snapshot, killed in the middle and resumed, under concurrent writers.

SNAP-03..08 (consistent snapshot, stream from its point), SNAP-28/31 (``op = r``,
``source.snapshot`` markers), FT-13 (an interrupted snapshot is finished, not restarted).
The child process (``python -m tests.integration.test_snapshot``) runs the bronze step and
is SIGKILLed by a crash point after a few chunks were recorded.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg2
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.faults import ENV
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot_state import SnapshotLog, progress_uri
from pgcdc_dagster.lake.delta import open_table
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]

SCHEMA = r"""
CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL, price numeric(10,2),
                    at timestamptz, note text);
CREATE TABLE pairs (a text, b int, v text, PRIMARY KEY (a, b));
INSERT INTO items SELECT g, 'item ' || g, g * 0.5,
    '2024-01-01'::timestamptz + g * interval '1 minute',
    CASE WHEN g % 10 = 0 THEN NULL WHEN g % 10 = 1 THEN '' ELSE
         repeat('x', g % 40) || E'\ttab\nline\\back "q" ,' END
    FROM generate_series(1, 20000) g;
INSERT INTO pairs SELECT 'k' || (g % 97), g, 'v' || g FROM generate_series(1, 6000) g;
"""
KEYS = {"items": ["id"], "pairs": ["a", "b"]}


def settings_for(dsn: str, lakehouse: Path, **kw: object) -> CaptureSettings:
    base: dict[str, object] = dict(dsn=dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                                   slot="snap", publication="snap", window_max_bytes=32 << 20,
                                   snapshot_chunk_bytes=192 << 10, snapshot_max_threads=2)
    base.update(kw)
    return CaptureSettings(**base)  # type: ignore[arg-type]


class Writer:
    """Random transactions on items and pairs in a thread; records every key it touches."""

    def __init__(self, dsn: str, seed: int) -> None:
        self.conn = psycopg2.connect(dsn)
        self.rng = random.Random(seed)
        self.touched: dict[str, set[tuple]] = {"items": set(), "pairs": set()}
        self.inserted: dict[str, set[tuple]] = {"items": set(), "pairs": set()}
        self.next_id = 1_000_000
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.transactions = 0

    def _step(self, cur: psycopg2.extensions.cursor) -> None:
        rng = self.rng
        r = rng.random()
        i = rng.randint(1, 20000)
        if r < 0.25:
            cur.execute("UPDATE items SET price = price + 1, note = note || 'u' WHERE id = %s",
                        (i,))
            self.touched["items"].add((i,))
        elif r < 0.4:
            cur.execute("DELETE FROM items WHERE id = %s", (i,))
            self.touched["items"].add((i,))
        elif r < 0.5:
            self.next_id += 1
            cur.execute("UPDATE items SET id = %s WHERE id = %s", (self.next_id, i))
            self.touched["items"].update({(i,), (self.next_id,)})
            self.inserted["items"].add((self.next_id,))
        elif r < 0.7:
            self.next_id += 1
            cur.execute("INSERT INTO items VALUES (%s, 'new', 1.5, now(), NULL)",
                        (self.next_id,))
            self.touched["items"].add((self.next_id,))
            self.inserted["items"].add((self.next_id,))
        elif r < 0.85:
            b = rng.randint(1, 6000)
            key = (f"k{b % 97}", b)
            cur.execute("UPDATE pairs SET v = v || '+' WHERE a = %s AND b = %s", key)
            self.touched["pairs"].add(key)
        elif r < 0.92:
            b = rng.randint(1, 6000)
            key = (f"k{b % 97}", b)
            cur.execute("DELETE FROM pairs WHERE a = %s AND b = %s", key)
            self.touched["pairs"].add(key)
        else:
            self.next_id += 1
            key = (f"n{self.next_id}", self.next_id)
            cur.execute("INSERT INTO pairs VALUES (%s, %s, 'new')", key)
            self.touched["pairs"].add(key)
            self.inserted["pairs"].add(key)

    def _loop(self) -> None:
        # A logical slot becomes consistent at a running-xacts WAL record that shows no
        # transaction older than the slot; PostgreSQL writes one every 15 s or at a
        # checkpoint, so under a nonstop writer a slot creation can wait that long. The
        # frequent CHECKPOINT only keeps the test fast.
        ticker = psycopg2.connect(self.conn.dsn)
        ticker.autocommit = True
        last = 0.0
        with self.conn.cursor() as cur, ticker.cursor() as tick:
            while not self.stop.is_set():
                for _ in range(self.rng.randint(1, 4)):
                    self._step(cur)
                self.conn.commit()
                self.transactions += 1
                if time.monotonic() - last > 0.5:
                    tick.execute("CHECKPOINT")
                    last = time.monotonic()
                self.stop.wait(0.02)
        ticker.close()

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        self.conn.close()


def bronze_table(lakehouse: Path, table: str) -> DeltaTable:
    return DeltaTable(table_uri(str(lakehouse), "bronze", "public", table))


def snapshot_keys(lakehouse: Path, table: str) -> list[tuple]:
    """Keys of the table's ``op = r`` events (all snapshots)."""
    data = bronze_table(lakehouse, table).to_pyarrow_table(columns=["key", "op"])
    rows = data.filter(pc.equal(data["op"], "r"))["key"].to_pylist()
    return [tuple(k[c] for c in KEYS[table]) for k in rows]


def check_converged(pg_conn, lakehouse: Path, tables=("items", "pairs")) -> None:
    for table in tables:
        assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public",
                                                       table), "public", table, KEYS[table])


def check_snapshot_events(pg_dsn: str, lakehouse: Path, writer: Writer, original: dict) -> None:
    """No key twice among the r events; every key no writer touched is there."""
    for table in ("items", "pairs"):
        keys = snapshot_keys(lakehouse, table)
        dupes = [k for k, n in Counter(keys).items() if n > 1]
        assert not dupes, f"{table}: keys read twice by the snapshot: {dupes[:5]}"
        got = set(keys)
        untouched = original[table] - writer.touched[table]
        missing = untouched - got
        assert not missing, f"{table}: {len(missing)} untouched keys missing: {sorted(missing)[:5]}"
        assert got <= original[table] | writer.inserted[table]


def source_keys(pg_conn) -> dict[str, set[tuple]]:
    out = {}
    with pg_conn.cursor() as cur:
        for table, key in KEYS.items():
            cur.execute(f"SELECT {', '.join(key)} FROM {table}")
            out[table] = {tuple(r) for r in cur.fetchall()}
    return out


def _child(dsn: str, lakehouse: Path, point: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **{ENV: point, "PYSPARK_PYTHON": sys.executable})
    return subprocess.run([sys.executable, "-m", "tests.integration.test_snapshot", dsn,
                           str(lakehouse)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_killed_snapshot_resumes_with_remaining_chunks(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    original = source_keys(pg_conn)
    settings = settings_for(pg_dsn, lakehouse)
    with Writer(pg_dsn, seed=5) as writer:
        proc = _child(pg_dsn, lakehouse, "snapshot_after_chunk_5")
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        state = SnapshotLog(progress_uri(str(lakehouse), "snap")).load()
        assert state is not None and state.open
        assert SnapshotLog(progress_uri(str(lakehouse), "snap")).load_open() == state
        read_before = sum(len(c) for c in state.chunks.values())
        total = sum(len(p.chunks) for p in state.plans.values())
        assert 5 <= read_before < total
        # Nothing of the killed run is visible in bronze or silver.
        for layer in ("bronze", "silver"):
            assert open_table(table_uri(str(lakehouse), layer, "public", "items")) is None
        run = run_bronze(settings_for(pg_dsn, lakehouse, max_windows=2), spark,
                         force_snapshot_step=False)
        assert run.snapshot is not None and run.snapshot.performed
        assert run.snapshot.slot_action == "temporary"
        assert run.snapshot.resumed_chunks >= 5
        assert run.snapshot.chunks_read == total - run.snapshot.resumed_chunks
        assert writer.transactions > 0
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    check_converged(pg_conn, lakehouse)
    check_snapshot_events(pg_dsn, lakehouse, writer, original)
    state = SnapshotLog(progress_uri(str(lakehouse), "snap")).load()
    assert state is not None and state.finished
    assert SnapshotLog(progress_uri(str(lakehouse), "snap")).load_open() is None
    points = {c.lsn for chunks in state.chunks.values() for c in chunks.values()}
    assert len(points) == 2, "kept chunks at the first point, the rest at the resumed point"


def test_killed_between_bronze_and_silver_commits(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    original = source_keys(pg_conn)
    settings = settings_for(pg_dsn, lakehouse)
    proc = _child(pg_dsn, lakehouse, "snapshot_after_bronze_commit")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    committed = [t for t in ("items", "pairs")
                 if open_table(table_uri(str(lakehouse), "bronze", "public", t)) is not None]
    assert committed  # tables finished together are committed at once: one or both
    with Writer(pg_dsn, seed=11) as writer:
        run = run_bronze(settings_for(pg_dsn, lakehouse, max_windows=2), spark,
                         force_snapshot_step=False)
        assert run.snapshot is not None and run.snapshot.performed
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    check_converged(pg_conn, lakehouse)
    check_snapshot_events(pg_dsn, lakehouse, writer, original)
    for table in committed:  # the committed table was not committed twice
        history = bronze_table(lakehouse, table).history()
        assert sum(1 for h in history if h.get("pgcdc.kind") == "snapshot") == 1


def check_markers_and_envelope(lakehouse: Path, settings: CaptureSettings, point: int) -> None:
    """Every r event at the snapshot's point; Debezium's first/last markers once each."""
    markers: Counter[str] = Counter()
    for table in ("items", "pairs"):
        data = bronze_table(lakehouse, table).to_pyarrow_table()
        source = data["source"].to_pylist()
        assert {s["lsn"] for s in source} == {point}
        assert set(data["__commit_lsn"].to_pylist()) == {point}
        assert set(data["op"].to_pylist()) == {"r"}
        markers.update(s["snapshot"] for s in source)
        assert bronze_table(lakehouse, table).transaction_version(
            f"{settings.app_prefix}:bronze:public.{table}") == point
    assert markers["first"] == 1 and markers["last"] == 1
    assert markers["first_in_data_collection"] == 1 and markers["last_in_data_collection"] == 1
    assert markers["true"] == 26000 - 4


def main(argv: list[str]) -> None:
    """Child process: one bronze step that a crash point kills."""
    from pgcdc_dagster.spark.session import build_session

    dsn, lakehouse = argv[:2]
    spark = build_session(app_name="pgcdc-snapshot-child")
    run_bronze(settings_for(dsn, Path(lakehouse)), spark, force_snapshot_step=True)


if __name__ == "__main__":
    main(sys.argv[1:])
