"""The ``slot_healthy`` asset check against real slots, one threshold at a time.

Each test puts a real slot into one unhealthy state (lag, retained WAL, spill, wal_status)
and runs the check in the ``capture_checks`` job; thresholds come from the ``PGCDC_SLOT_*``
environment variables, as in production.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import dagster as dg
import psycopg2
import pytest
from psycopg2 import sql

from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

SLOT = "dg_health"


def slot_check(dsn: str, lakehouse, env: dict[str, str]) -> dg.AssetCheckEvaluation:
    """Run the slot_healthy check (the only check when no table is captured)."""
    definitions = build_definitions([], {
        "postgres": PostgresResource(dsn=dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables="public\\..*", slot=SLOT, publication=SLOT),
        "spark": SparkResource(),
    }, settings=MonitorSettings.from_env(env))
    with dg.instance_for_test() as instance:
        result = definitions.resolve_job_def("capture_checks").execute_in_process(
            instance=instance)
    assert result.success
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == "slot_healthy"
    return evaluation


def meta(evaluation: dg.AssetCheckEvaluation, name: str) -> object:
    return evaluation.metadata[name].value


@pytest.fixture
def slot(pg_conn) -> Iterator[psycopg2.extensions.connection]:
    with pg_conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, payload text)")
        cur.execute(f"CREATE PUBLICATION {SLOT} FOR TABLE items")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    yield pg_conn


def write_wal(conn, first: int, rows: int = 1000) -> None:
    with conn.cursor() as cur:
        cur.execute("INSERT INTO items SELECT g, repeat('x', 200) FROM generate_series(%s, %s) g",
                    (first, first + rows - 1))


def test_slot_healthy_passes_then_warns_on_lag(pg_dsn, slot, lakehouse) -> None:
    """MON-06: slot lag in bytes (pg_current_wal_lsn() - confirmed_flush_lsn)."""
    env = {"PGCDC_SLOT_MAX_LAG_BYTES": "64kB", "PGCDC_SLOT_MAX_RETAINED_BYTES": "1TB"}
    healthy = slot_check(pg_dsn, lakehouse, env)
    assert healthy.passed, healthy.description
    assert meta(healthy, "wal_status") == "reserved"

    write_wal(slot, 0)  # ~250 kB of WAL the slot has not confirmed
    lagging = slot_check(pg_dsn, lakehouse, env)
    assert not lagging.passed and lagging.severity == dg.AssetCheckSeverity.WARN
    assert "lag" in lagging.description and "exceeds 65536" in lagging.description
    assert "retained WAL" not in lagging.description
    assert meta(lagging, "lag_bytes") > 64 << 10
    assert meta(lagging, "max_lag_bytes") == 64 << 10


def test_slot_healthy_warns_on_retained_wal(pg_dsn, slot, lakehouse) -> None:
    """MON-02 / STR-16: confirmed_flush_lsn moved on, restart_lsn (retained WAL) did not."""
    write_wal(slot, 0)
    with slot.cursor() as cur:
        cur.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_flush_lsn())",
                    (SLOT,))
    evaluation = slot_check(pg_dsn, lakehouse, {"PGCDC_SLOT_MAX_LAG_BYTES": "1TB",
                                                "PGCDC_SLOT_MAX_RETAINED_BYTES": "64kB"})
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN
    assert "retained WAL" in evaluation.description
    assert "exceeds 65536" in evaluation.description
    assert meta(evaluation, "retained_bytes") > 64 << 10
    assert meta(evaluation, "lag_bytes") < 64 << 10


def test_slot_healthy_warns_when_decoding_spills(pg_dsn, slot, lakehouse) -> None:
    """A transaction larger than logical_decoding_work_mem spilled to disk while decoding."""
    with slot.cursor() as cur:
        cur.execute("SELECT current_database()")
        cur.execute(sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'")
                    .format(sql.Identifier(cur.fetchone()[0])))
    write_wal(slot, 0, rows=20000)  # one transaction of ~5 MB
    decoder = psycopg2.connect(pg_dsn)  # a new session: 64 kB of decoding memory
    decoder.autocommit = True
    try:
        with decoder.cursor() as cur:
            # 20000 Inserts (PostgreSQL 14 also sends the empty transactions 15+ skip).
            cur.execute("SELECT count(*) FILTER (WHERE get_byte(data, 0) = ascii('I')) "
                        "FROM pg_logical_slot_peek_binary_changes("
                        "%s, pg_current_wal_flush_lsn(), NULL, 'proto_version', '1', "
                        "'publication_names', %s)", (SLOT, SLOT))
            assert cur.fetchone()[0] == 20000
    finally:
        decoder.close()
    env = {"PGCDC_SLOT_MAX_LAG_BYTES": "1TB", "PGCDC_SLOT_MAX_RETAINED_BYTES": "1TB",
           "PGCDC_SLOT_MAX_SPILL_RATIO": "0.1"}
    deadline = time.monotonic() + 30  # slot statistics reach the view asynchronously
    while True:
        evaluation = slot_check(pg_dsn, lakehouse, env)
        if meta(evaluation, "spill_bytes") or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN
    assert "spilled to disk" in evaluation.description
    assert "raise logical_decoding_work_mem" in evaluation.description
    assert meta(evaluation, "spill_ratio") > 0.1
    assert meta(evaluation, "max_spill_ratio") == 0.1
    # The same slot within a laxer ratio passes.
    assert slot_check(pg_dsn, lakehouse, {**env, "PGCDC_SLOT_MAX_SPILL_RATIO": "1"}).passed


def test_slot_healthy_fails_when_wal_status_is_lost(pg_server, pg_dsn, slot, lakehouse) -> None:
    """FT-20 / GAP-13: max_slot_wal_keep_size invalidated the slot (wal_status lost)."""
    admin = psycopg2.connect(pg_server)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
            cur.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)
        status = None
        for first in range(0, 10_000, 1000):  # a few WAL segments past the slot, then removed
            write_wal(slot, first)
            with slot.cursor() as cur:
                cur.execute("SELECT pg_switch_wal()")
                cur.execute("CHECKPOINT")
                cur.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s",
                            (SLOT,))
                status = cur.fetchone()[0]
            if status == "lost":
                break
        assert status == "lost"
    finally:
        with admin.cursor() as cur:
            cur.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            cur.execute("SELECT pg_reload_conf()")
        admin.close()
    evaluation = slot_check(pg_dsn, lakehouse, {})
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert "wal_status is 'lost'" in evaluation.description
    assert "re-snapshot" in evaluation.description
    assert meta(evaluation, "wal_status") == "lost"


def test_slot_thresholds_from_the_environment() -> None:
    settings = MonitorSettings.from_env({"PGCDC_SLOT_MAX_SPILL_RATIO": "0.25"})
    assert settings.slot.max_spill_ratio == 0.25
    from pgcdc_dagster.exceptions import ConfigurationError
    with pytest.raises(ConfigurationError, match="PGCDC_SLOT_MAX_SPILL_RATIO = '2'"):
        MonitorSettings.from_env({"PGCDC_SLOT_MAX_SPILL_RATIO": "2"})
    with pytest.raises(ConfigurationError, match="PGCDC_LAG_TRIGGER_CHANGES = 'many'"):
        MonitorSettings.from_env({"PGCDC_LAG_TRIGGER_CHANGES": "many"})
    assert MonitorSettings.from_env({"PGCDC_LAG_TRIGGER_CHANGES": "0"}).lag_trigger_changes == 0
