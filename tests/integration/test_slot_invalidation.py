"""PostgreSQL 18's ``idle_replication_slot_timeout`` against a slot read by peeks: the slot is
inactive between micro-batches (``inactive_since`` set), so the health check warns with the
time left before a checkpoint may invalidate it, and once invalidated (``idle_timeout``) the
check, the stream step and ``snapshot.mode = when_needed`` treat it as lost, naming the fix.

(``max_slot_wal_keep_size`` exceeded, ``wal_status = lost``, is covered on every version by
``tests/dagster/test_slot_health_check.py::test_slot_healthy_fails_when_wal_status_is_lost``.)
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcdc_dagster.capture.snapshot_modes import decide
from pgcdc_dagster.exceptions import SlotLostError
from pgcdc_dagster.ops.slot_health import SlotThresholds, slot_health
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.local_cluster import LocalCluster
from pgcdc_dagster.postgres.slot import require_usable_slot, slot_info
from tests.support.ha import query, session_pg_major, wait_for

pytestmark = pytest.mark.integration

MAJOR = session_pg_major()
TIMEOUT_S = 2


@pytest.fixture
def idle_cluster() -> Iterator[str]:
    """A cluster of its own (the timeout would invalidate every idle slot of the shared one)."""
    root = Path(tempfile.mkdtemp(prefix="pgcdc-test-idle-"))
    cluster = LocalCluster(root / "pg", major=MAJOR, overrides=(
        {"idle_replication_slot_timeout": f"'{TIMEOUT_S}s'"} if MAJOR >= 18 else {}))
    try:
        yield cluster.start().dsn
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_idle_slot_warns_with_time_left_then_is_reported_lost(idle_cluster: str) -> None:
    dsn = idle_cluster
    query(dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    query(dsn, "CREATE PUBLICATION p FOR TABLE t")
    query(dsn, "SELECT pg_create_logical_replication_slot('idle', 'pgoutput')")
    query(dsn, "INSERT INTO t VALUES (1)")
    query(dsn, "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('idle', NULL, NULL, "
               "'proto_version', '1', 'publication_names', 'p')")
    health = slot_health(dsn, "idle")
    limits = SlotThresholds(idle_warn_fraction=0.0)  # warn as soon as it is idle
    if MAJOR < 18:
        assert health.idle_timeout_s is None and health.idle_time_left_s is None
        assert not [p for p in health.problems(limits) if "idle" in p]
        return
    assert health.idle_seconds is not None  # a peek-read slot is inactive between reads
    assert health.idle_timeout_s == TIMEOUT_S
    assert health.idle_time_left_s is not None and health.idle_time_left_s <= TIMEOUT_S
    [warning] = health.problems(limits)
    assert "idle_replication_slot_timeout = 2 s" in warning and "cdc_microbatch" in warning
    assert not health.problems(SlotThresholds())  # within the default share: no warning yet

    time.sleep(TIMEOUT_S + 0.5)  # past the timeout; the next checkpoint invalidates it

    def invalidated() -> bool:
        query(dsn, "CHECKPOINT")
        return slot_health(dsn, "idle").invalidation_reason is not None

    wait_for("the idle slot's invalidation", invalidated, timeout=30)
    lost = slot_health(dsn, "idle")
    assert lost.invalidation_reason == "idle_timeout"
    [problem] = lost.problems(SlotThresholds())
    assert "invalidated (idle_timeout)" in problem and "snapshot.mode = when_needed" in problem
    with connection(dsn) as conn:
        with pytest.raises(SlotLostError, match="inactive longer than idle_replication_slot"):
            require_usable_slot(conn, "idle")
        info = slot_info(conn, "idle")
    # when_needed recreates the slot and snapshots again; initial refuses.
    decision = decide("when_needed", force=False, slot=info, slot_name="idle",
                      tables=[("public", "t")], offsets={("public", "t"): True},
                      open_snapshot=None)
    assert decision.slot_action == "recreate"
    with pytest.raises(SlotLostError, match="when_needed"):
        decide("initial", force=False, slot=info, slot_name="idle", tables=[("public", "t")],
               offsets={("public", "t"): True}, open_snapshot=None)
