"""Source safety of the stream: window bounds, time budget,
heartbeats on a busy server, ``publication.autocreate.mode``.

STR-16/17/36/38 (slot positions and WAL retention), STR-29/30/31 (publications), FT-02
(clear configuration errors), FT-12 (a run that stops early loses nothing).
"""

from __future__ import annotations

import dataclasses
import os

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.paths import internal_uri, table_uri
from pgcdc_dagster.postgres.slot import current_flush_lsn, slot_info
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _settings(pg_dsn, lakehouse, include=("public\\.q",), **kw) -> CaptureSettings:
    return CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=include,
                           slot="safe", publication="safe", **kw)


def _stream_ops(lakehouse, table: str) -> list[str]:
    bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", table)).to_pyarrow_table()
    return bronze.filter(pc.not_equal(bronze["op"], "r")).column("op").to_pylist()


# --- window bounds -------------------------------------------------------------------------

def test_window_max_bytes_bounds_every_window(pg_dsn, pg_conn, spark, lakehouse) -> None:
    """STR-18: every window spans at most ``window_max_bytes`` of WAL; a
    transaction larger than the cap arrives whole, in the window where it commits (the
    windows before it are empty); nothing lost or doubled."""
    cap = 64 << 10
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE q (id int PRIMARY KEY, pad text)")
    settings = _settings(pg_dsn, lakehouse, window_max_bytes=cap)
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        for i in range(30):  # 30 transactions of ~20 kB of WAL
            cur.execute("INSERT INTO q SELECT g, repeat('x', 150) FROM generate_series(%s, %s) g",
                        (i * 100, i * 100 + 99))
        cur.execute("BEGIN")  # one transaction of ~250 kB, larger than the cap
        cur.execute("UPDATE q SET pad = repeat('y', 150) WHERE id < 1500")
        cur.execute("COMMIT")
    report = run_bronze(settings, spark, force_snapshot_step=False).stream
    assert report is not None and len(report.windows) >= 6
    spans = [int(w.end) - int(w.start) for w in report.windows]
    assert all(0 < s <= cap for s in spans), spans
    assert all(int(a.end) == int(b.start) for a, b in zip(report.windows, report.windows[1:],
                                                          strict=False))
    assert max(w.changes for w in report.windows) == 1500  # the big one, whole
    ops = _stream_ops(lakehouse, "q")
    assert ops.count("c") == 3000 and ops.count("u") == 1500
    run_silver(settings, spark)
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "q"),
                                "public", "q", ["id"])


def test_time_budget_stops_at_a_window_boundary(pg_dsn, pg_conn, spark, lakehouse) -> None:
    """FT-12: ``time_budget_s`` ends a run at a window boundary before the WAL
    flushed at its start is read; the slot stays at the last committed window and the next
    run reads the rest: every change once, silver equals the source."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE q (id int PRIMARY KEY, pad text)")
    settings = _settings(pg_dsn, lakehouse, window_max_bytes=16 << 10, time_budget_s=0.3)
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        for i in range(60):
            cur.execute("INSERT INTO q SELECT g, repeat('x', 150) FROM generate_series(%s, %s) g",
                        (i * 50, i * 50 + 49))
        target = current_flush_lsn(pg_conn)
    first = run_bronze(settings, spark, force_snapshot_step=False).stream
    assert first is not None and first.end is not None
    assert 1 <= len(first.windows) and first.end < target
    assert slot_info(pg_conn, "safe").confirmed_flush_lsn == first.end
    assert first.seconds < 0.3 + 5 * max(w.seconds for w in first.windows) + 2
    second = run_bronze(dataclasses.replace(settings, time_budget_s=600), spark,
                        force_snapshot_step=False).stream
    assert second is not None and second.start == first.end
    assert second.end is not None and second.end >= target
    assert sorted(_stream_ops(lakehouse, "q")) == ["c"] * 3000
    run_silver(settings, spark)
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "q"),
                                "public", "q", ["id"])


# --- heartbeats ----------------------------------------------------------------------------

@pytest.mark.parametrize("heartbeat_ms", [0, 1000])
def test_quiet_capture_on_busy_server_advances_the_slot(pg_dsn, pg_conn, spark, lakehouse,
                                                        heartbeat_ms) -> None:
    """STR-16/17/36/38: only an uncaptured table is written (heavily). Every run confirms
    the WAL flushed at its start (``confirmed_flush_lsn``), with or without heartbeats: a
    window with no captured event still advances the slot, unlike Debezium, which confirms
    only the LSN of events it emitted (STR-17). ``restart_lsn`` follows as soon as the server
    logs a running-transactions record (a checkpoint, or the background writer every 15 s),
    so retained WAL stays bounded by what was written since the previous run."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE q (id int PRIMARY KEY, v text)")
        cur.execute("CREATE TABLE noise (id bigserial PRIMARY KEY, pad text)")
        cur.execute("INSERT INTO q VALUES (1, 'quiet')")
    settings = _settings(pg_dsn, lakehouse, heartbeat_interval_ms=heartbeat_ms)
    run_bronze(settings, spark, force_snapshot_step=True)
    confirmed, restart, retained = [], [], []
    for _ in range(3):
        with pg_conn.cursor() as cur:
            cur.execute("INSERT INTO noise (pad) SELECT repeat('x', 200) "
                        "FROM generate_series(1, 5000)")  # ~1.7 MB of WAL
            cur.execute("CHECKPOINT")
            flushed = current_flush_lsn(pg_conn)
        run_bronze(settings, spark, force_snapshot_step=False)
        info = slot_info(pg_conn, "safe")
        assert info is not None and info.confirmed_flush_lsn is not None
        assert info.restart_lsn is not None
        assert info.confirmed_flush_lsn >= flushed
        confirmed.append(int(info.confirmed_flush_lsn))
        restart.append(int(info.restart_lsn))
        retained.append(info.retained_bytes)
    assert confirmed == sorted(set(confirmed)), confirmed
    assert restart == sorted(set(restart)), restart
    assert max(retained) < 3 << 20, [str(Lsn(x)) for x in restart]
    assert _stream_ops(lakehouse, "q") == []  # nothing captured but the slot moved
    assert not os.path.exists(table_uri(str(lakehouse), "bronze", "public", "noise"))
    # Heartbeats are the project's own messages (prefix pgcdc.): never user events.
    assert not os.path.exists(internal_uri(str(lakehouse), "messages"))


# --- publication.autocreate.mode -----------------------------------------------------------

def test_all_tables_publication_drops_uncaptured_events(pg_dsn, pg_conn, spark,
                                                        lakehouse) -> None:
    """STR-29/30: ``all_tables`` creates ``FOR ALL TABLES``; events of tables outside the
    capture set are decoded but dropped; captured tables stream as usual."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE q (id int PRIMARY KEY, v text)")
        cur.execute("CREATE TABLE other (id int PRIMARY KEY, v text)")
    settings = _settings(pg_dsn, lakehouse, publication_autocreate="all_tables")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT puballtables FROM pg_publication WHERE pubname = 'safe'")
        assert cur.fetchone()[0] is True
        cur.execute("INSERT INTO other VALUES (1, 'x')")
        cur.execute("INSERT INTO q VALUES (1, 'a')")
        cur.execute("UPDATE other SET v = 'y'")
        cur.execute("UPDATE q SET v = 'b'")
        cur.execute("DELETE FROM other")
    run = run_bronze(settings, spark, force_snapshot_step=False)
    assert run.stream is not None
    assert set(run.stream.events_by_table()) == {"public.q"}
    assert sorted(_stream_ops(lakehouse, "q")) == ["c", "u"]
    assert not os.path.exists(table_uri(str(lakehouse), "bronze", "public", "other"))
    run_silver(settings, spark)
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "q"),
                                "public", "q", ["id"])


def test_disabled_mode_errors_name_publication_and_fix(pg_dsn, pg_conn, spark,
                                                       lakehouse) -> None:
    """STR-29/30/31, FT-02: ``disabled`` never creates or alters a publication; a missing
    one, or one without a captured table, is a configuration error naming the publication,
    the table and the statement that fixes it; nothing is created meanwhile."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE q (id int PRIMARY KEY, v text)")
        cur.execute("CREATE TABLE r (id int PRIMARY KEY, v text)")
    settings = _settings(pg_dsn, lakehouse, include=("public\\.q", "public\\.r"),
                         publication_autocreate="disabled")
    with pytest.raises(ConfigurationError, match=r"'safe' does not exist.*CREATE PUBLICATION"):
        run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'safe'")
        assert cur.fetchone()[0] == 0
        cur.execute("CREATE PUBLICATION safe FOR TABLE q")
    with pytest.raises(ConfigurationError,
                       match=r"'safe' does not publish public\.r.*ALTER PUBLICATION safe ADD "
                             r"TABLE public\.r"):
        run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = 'safe'")
        assert [r[0] for r in cur.fetchall()] == ["q"]
        cur.execute("ALTER PUBLICATION safe ADD TABLE r")
        cur.execute("INSERT INTO r VALUES (1, 'a')")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE r SET v = 'b'")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    assert _stream_ops(lakehouse, "r") == ["u"]
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "r"),
                                "public", "r", ["id"])
