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
from pgcdc_dagster.postgres.slot import WAL_END_SQL

_SLOT_SQL = """
SELECT s.slot_name, s.plugin, s.active, s.active_pid, s.restart_lsn::text,
       s.confirmed_flush_lsn::text, s.wal_status, s.safe_wal_size,
       (""" + WAL_END_SQL + """)::text,
       COALESCE(""" + WAL_END_SQL + """ - s.restart_lsn, 0)::bigint,
       COALESCE(""" + WAL_END_SQL + """ - s.confirmed_flush_lsn, 0)::bigint,
       st.spill_txns, st.spill_count, st.spill_bytes, st.stream_txns, st.stream_bytes,
       st.total_txns, st.total_bytes,
       to_jsonb(s) ->> 'invalidation_reason', (to_jsonb(s) ->> 'failover')::boolean,
       (to_jsonb(s) ->> 'synced')::boolean,
       EXTRACT(epoch FROM now() - (to_jsonb(s) ->> 'inactive_since')::timestamptz)::float8,
       (SELECT setting::bigint FROM pg_settings WHERE name = 'idle_replication_slot_timeout'
        AND unit = 's')
FROM pg_replication_slots s
LEFT JOIN pg_stat_replication_slots st ON st.slot_name = s.slot_name
WHERE s.slot_name = %s
"""

HEALTHY_WAL_STATUS = ("reserved", "extended")
"""``unreserved`` means the WAL is past ``max_wal_size`` and may be removed at the next
checkpoint; ``lost`` means it was removed and the slot is unusable."""

_RESNAPSHOT = ("Fix: drop the slot (teardown job) and take a new snapshot (initial_snapshot), "
               "or set snapshot.mode = when_needed and the next run does both (a re-snapshot "
               "replaces silver)")

_INVALIDATION_CAUSES = {
    "wal_removed": "the WAL it needed was removed (max_slot_wal_keep_size exceeded)",
    "idle_timeout": "it was inactive longer than idle_replication_slot_timeout (a slot read "
                    "by peeks is inactive between micro-batches)",
    "rows_removed": "catalog rows it needed were removed (on a standby: hot_standby_feedback "
                    "off, or no physical slot between standby and primary)",
    "wal_level_insufficient": "wal_level on the primary is below logical",
}


@dataclass(frozen=True, slots=True)
class SlotThresholds:
    """Limits beyond which the slot is unhealthy (and the lag sensor launches a run)."""

    max_lag_bytes: int = 1 << 30
    """WAL written since the slot's confirmed position (what a micro-batch still has to read)."""
    max_retained_bytes: int = 4 << 30
    """WAL the server keeps for the slot (from ``restart_lsn``): disk it cannot recycle."""
    max_spill_ratio: float = 0.5
    """Share of decoded bytes spilled to disk; above it, raise ``logical_decoding_work_mem``."""
    idle_warn_fraction: float = 0.5
    """With ``idle_replication_slot_timeout`` (PostgreSQL 18), warn once the slot has been
    inactive for more than this share of the timeout."""


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
    invalidation_reason: str | None = None
    """Why PostgreSQL invalidated the slot (17+: ``wal_removed``, ``idle_timeout``,
    ``rows_removed``, ``wal_level_insufficient``); None when it is valid."""
    failover: bool | None = None
    """A failover slot (17+), synchronized to standbys with ``sync_replication_slots``."""
    synced: bool | None = None
    """A copy synchronized from the primary (17+, on a standby or a promoted standby)."""
    idle_seconds: float | None = None
    """Seconds since the slot was last used (``inactive_since``, 17+); None while in use."""
    idle_timeout_s: int | None = None
    """``idle_replication_slot_timeout`` in seconds (18+; 0 = off, None = no such setting)."""

    @property
    def idle_time_left_s(self) -> float | None:
        """Seconds until ``idle_replication_slot_timeout`` lets the next checkpoint invalidate
        the slot (negative: overdue); None when the timeout is off or the slot is in use."""
        if not self.idle_timeout_s or self.idle_seconds is None or self.active:
            return None
        return self.idle_timeout_s - self.idle_seconds

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
        if self.invalidation_reason is not None:
            cause = _INVALIDATION_CAUSES.get(self.invalidation_reason, "see PostgreSQL's log")
            out.append(f"wal_status is {self.wal_status!r}, the slot is invalidated "
                       f"({self.invalidation_reason}): {cause}; the changes since its "
                       f"position are lost. {_RESNAPSHOT}")
        elif self.wal_status not in HEALTHY_WAL_STATUS:
            left = ("" if self.safe_wal_size is None else
                    f" ({self.safe_wal_size} bytes of WAL left before it is lost)")
            out.append(
                f"wal_status is {self.wal_status!r}: "
                + (f"the WAL the slot needs was removed; the changes since its position are "
                   f"lost. {_RESNAPSHOT}" if self.wal_status == "lost" else
                   "the slot's WAL exceeds max_wal_size and may be removed at the next "
                   f"checkpoint (max_slot_wal_keep_size){left}; run cdc_microbatch now"))
        left_s = self.idle_time_left_s
        if (left_s is not None and self.idle_timeout_s and self.invalidation_reason is None
                and left_s < self.idle_timeout_s * (1 - limits.idle_warn_fraction)):
            when = (f"in {left_s:.0f} s" if left_s > 0 else "now")
            out.append(
                f"the slot has been inactive for {self.idle_seconds:.0f} s and "
                f"idle_replication_slot_timeout = {self.idle_timeout_s} s: the first "
                f"checkpoint from {when} invalidates it (a slot read by peeks is inactive "
                "between micro-batches). Run cdc_microbatch now and schedule it more often "
                f"than every {self.idle_timeout_s} s, or raise idle_replication_slot_timeout "
                "(0 disables it)")
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
            cur.execute(f"SELECT ({WAL_END_SQL})::text")
            return SlotHealth(slot, False, current_lsn=Lsn.parse(cur.fetchone()[0]))
    (name, plugin, active, pid, restart, confirmed, wal_status, safe, current, retained, lag,
     spill_txns, spill_count, spill_bytes, stream_txns, stream_bytes, total_txns,
     total_bytes, reason, failover, synced, idle, idle_timeout) = row
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
        total_bytes=int(total_bytes or 0), invalidation_reason=reason, failover=failover,
        synced=synced, idle_seconds=None if idle is None else float(idle),
        idle_timeout_s=None if idle_timeout is None else int(idle_timeout),
    )


def slot_health(dsn: str, slot: str) -> SlotHealth:
    """:func:`read_slot_health` on a connection of its own."""
    with connection(dsn) as conn:
        return read_slot_health(conn, slot)
