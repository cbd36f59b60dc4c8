"""Health of the replication slot: WAL status, lag, retained WAL and spill counters.

``pg_replication_slots`` tells how far behind the slot is and whether the server still keeps
its WAL; ``pg_stat_replication_slots`` (PostgreSQL 14+) counts what logical decoding spilled
to disk or streamed because a transaction outgrew ``logical_decoding_work_mem``.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg2.extensions

from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.postgres.connection import connection

_SLOT_SQL = """
SELECT s.slot_name, s.plugin, s.active, s.active_pid, s.restart_lsn::text,
       s.confirmed_flush_lsn::text, s.wal_status, s.safe_wal_size,
       pg_current_wal_lsn()::text,
       COALESCE(pg_current_wal_lsn() - s.restart_lsn, 0)::bigint,
       COALESCE(pg_current_wal_lsn() - s.confirmed_flush_lsn, 0)::bigint,
       st.spill_txns, st.spill_count, st.spill_bytes, st.stream_txns, st.stream_bytes,
       st.total_txns, st.total_bytes
FROM pg_replication_slots s
LEFT JOIN pg_stat_replication_slots st ON st.slot_name = s.slot_name
WHERE s.slot_name = %s
"""

HEALTHY_WAL_STATUS = ("reserved", "extended")
"""``unreserved`` means the WAL is past ``max_wal_size`` and may be removed at the next
checkpoint; ``lost`` means it was removed and the slot is unusable."""


@dataclass(frozen=True, slots=True)
class SlotThresholds:
    """Limits beyond which the slot is unhealthy (and the lag sensor launches a run)."""

    max_lag_bytes: int = 1 << 30
    """WAL written since the slot's confirmed position (what a micro-batch still has to read)."""
    max_retained_bytes: int = 4 << 30
    """WAL the server keeps for the slot (from ``restart_lsn``): disk it cannot recycle."""
    max_spill_ratio: float = 0.5
    """Share of decoded bytes spilled to disk; above it, raise ``logical_decoding_work_mem``."""


@dataclass(frozen=True, slots=True)
class SlotHealth:
    """One reading of a slot (``exists`` False when the slot is missing)."""

    name: str
    exists: bool
    current_lsn: Lsn | None = None
    plugin: str = ""
    active: bool = False
    active_pid: int | None = None
    restart_lsn: Lsn | None = None
    confirmed_flush_lsn: Lsn | None = None
    wal_status: str | None = None
    safe_wal_size: int | None = None
    retained_bytes: int = 0
    lag_bytes: int = 0
    spill_txns: int = 0
    spill_count: int = 0
    spill_bytes: int = 0
    stream_txns: int = 0
    stream_bytes: int = 0
    total_txns: int = 0
    total_bytes: int = 0

    @property
    def spill_ratio(self) -> float:
        """Spilled bytes over decoded bytes since the statistics were last reset."""
        return self.spill_bytes / self.total_bytes if self.total_bytes else 0.0

    def problems(self, limits: SlotThresholds) -> list[str]:
        """What is wrong with the slot under ``limits`` (empty when healthy)."""
        if not self.exists:
            return [f"replication slot {self.name!r} does not exist: run the initial_snapshot "
                    "job to create it"]
        out = []
        if self.wal_status not in HEALTHY_WAL_STATUS:
            out.append(
                f"wal_status is {self.wal_status!r}: "
                + ("the WAL the slot needs was removed; drop the slot (teardown job) and "
                   "re-snapshot" if self.wal_status == "lost" else
                   "the slot's WAL exceeds max_wal_size and may be removed at the next "
                   "checkpoint (max_slot_wal_keep_size); run cdc_microbatch now"))
        if self.lag_bytes > limits.max_lag_bytes:
            out.append(f"lag {self.lag_bytes} bytes exceeds {limits.max_lag_bytes}: the "
                       "micro-batches do not keep up (run them more often, or larger windows)")
        if self.retained_bytes > limits.max_retained_bytes:
            out.append(f"retained WAL {self.retained_bytes} bytes exceeds "
                       f"{limits.max_retained_bytes}: the server cannot recycle that WAL")
        if self.spill_ratio > limits.max_spill_ratio:
            out.append(f"{self.spill_ratio:.0%} of decoded bytes were spilled to disk "
                       f"(spill_bytes {self.spill_bytes} of total_bytes {self.total_bytes}): "
                       "raise logical_decoding_work_mem")
        return out


def read_slot_health(conn: psycopg2.extensions.connection, slot: str) -> SlotHealth:
    """Read the slot's state and decoding statistics."""
    with conn.cursor() as cur:
        cur.execute(_SLOT_SQL, (slot,))
        row = cur.fetchone()
        if row is None:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            return SlotHealth(slot, False, current_lsn=Lsn.parse(cur.fetchone()[0]))
    (name, plugin, active, pid, restart, confirmed, wal_status, safe, current, retained, lag,
     spill_txns, spill_count, spill_bytes, stream_txns, stream_bytes, total_txns,
     total_bytes) = row
    return SlotHealth(
        name=str(name), exists=True, current_lsn=Lsn.parse(current), plugin=plugin or "",
        active=bool(active), active_pid=pid,
        restart_lsn=Lsn.parse(restart) if restart else None,
        confirmed_flush_lsn=Lsn.parse(confirmed) if confirmed else None,
        wal_status=wal_status, safe_wal_size=None if safe is None else int(safe),
        retained_bytes=int(retained), lag_bytes=int(lag),
        spill_txns=int(spill_txns or 0), spill_count=int(spill_count or 0),
        spill_bytes=int(spill_bytes or 0), stream_txns=int(stream_txns or 0),
        stream_bytes=int(stream_bytes or 0), total_txns=int(total_txns or 0),
        total_bytes=int(total_bytes or 0),
    )


def slot_health(dsn: str, slot: str) -> SlotHealth:
    """:func:`read_slot_health` on a connection of its own."""
    with connection(dsn) as conn:
        return read_slot_health(conn, slot)
