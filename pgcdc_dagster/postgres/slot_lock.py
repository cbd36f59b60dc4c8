"""One reader per slot, enforced by PostgreSQL: a session-level advisory lock per slot.

Every code path that reads, advances, creates or drops the capture's slot (micro-batch
windows, the initial snapshot, incremental snapshots, teardown, the silver-against-source
check's peek) first takes the slot's lock with ``pg_try_advisory_lock(class, key)`` on a
connection of its own, and keeps that connection idle and open while it works. A second
reader keeps trying for a few seconds (:data:`LOCK_GRACE_S`: a run killed a moment ago still
holds the lock until its backend notices), then gets
:class:`~pgcdc_dagster.exceptions.SlotInUseError` naming the holder (pid,
``application_name`` with the Dagster run id, client address, since when) and writes nothing.
The lock dies with its session, so a killed process frees it as soon as the server sees the
connection close (TCP keepalives on the session bound that for a host that vanished): whether
anyone holds it is how the schedule and the sensors tell a live run from
a dead one (``assets/run_liveness.py``).

The key: advisory locks are scoped to the current database, and a logical slot belongs to one
database that every reader connects to, so the key only names the slot. The two-``int4`` form
is used: the first key is the project's constant :data:`LOCK_CLASS` (locks taken with one
``bigint`` key live in another key space and never conflict with these), the second a 32-bit
BLAKE2b digest of the slot name. Two slot names of one database sharing a digest (about one
chance in four billion) would only serialize their captures, never let two readers in.

Within one thread the lock is re-entrant (:func:`slot_guard` reuses the thread's lease): a
Dagster run takes it in its first capture step and keeps it until the run ends
(``CaptureResource.hold_slot``), and the engine functions it calls find it held. Another
thread of the same process is another reader and is refused like another process, unless
the holder lends it its lease (:func:`lease_lent`).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg2
import psycopg2.extensions

from pgcdc_dagster.exceptions import SlotInUseError
from pgcdc_dagster.postgres.connection import connect, connection

LOCK_CLASS = 0x70676364
"""First key of every slot lock of this project (``'pgcd'``; pg_locks.classid)."""

APPLICATION_PREFIX = "pgcdc_dagster run "
"""``application_name`` of a lock session of a Dagster run, followed by the run id."""

LOCK_GRACE_S = 3.0
"""How long a refused reader keeps trying before it gives up. A process killed a moment ago
still holds the lock until its server backend notices the closed socket and exits (usually
milliseconds, longer on a loaded host): an immediate rerun waits that out instead of failing."""

_SESSION_SETTINGS = (
    # The session must live as long as the run: never closed by an idle timeout, and a
    # client that vanished without closing its socket is noticed within about a minute.
    ("idle_session_timeout", "0"),
    ("tcp_keepalives_idle", "30"),
    ("tcp_keepalives_interval", "10"),
    ("tcp_keepalives_count", "3"),
)


def lock_key(slot: str) -> int:
    """The second key of the slot's lock: a signed 32-bit digest of its name."""
    digest = hashlib.blake2b(slot.encode(), digest_size=4, person=b"pgcdc-slot").digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True, slots=True)
class LockHolder:
    """The session holding a slot's lock, as ``pg_stat_activity`` shows it."""

    pid: int
    application_name: str | None
    client: str | None
    since: str | None
    """When the session started (the lock is taken right after)."""

    @property
    def run_id(self) -> str | None:
        """The Dagster run holding the lock, when its session says so."""
        name = self.application_name or ""
        if not name.startswith(APPLICATION_PREFIX):
            return None
        return name[len(APPLICATION_PREFIX):] or None

    def describe(self) -> str:
        parts = [f"pid {self.pid}"]
        if self.run_id:
            parts.append(f"Dagster run {self.run_id}")
        elif self.application_name:
            parts.append(f"application_name {self.application_name!r}")
        if self.client:
            parts.append(f"client {self.client}")
        if self.since:
            parts.append(f"connected since {self.since}")
        return ", ".join(parts)


_HOLDER = """
SELECT l.pid, a.application_name, host(a.client_addr), a.backend_start::text
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid
"""


def lock_holder(conn: psycopg2.extensions.connection, slot: str) -> LockHolder | None:
    """Who holds the slot's lock (None: nobody). Reads ``pg_locks``; never takes the lock."""
    with conn.cursor() as cur:
        cur.execute(_HOLDER, (LOCK_CLASS, lock_key(slot) & 0xFFFFFFFF))
        row = cur.fetchone()
    if row is None:
        return None
    pid, app, client, since = row
    return LockHolder(int(pid), app, client, since)


def slot_lock_holder(dsn: str, slot: str) -> LockHolder | None:
    """:func:`lock_holder` on a connection of its own."""
    with connection(dsn) as conn:
        return lock_holder(conn, slot)


def in_use_message(slot: str, holder: LockHolder | None) -> str:
    """What a refused reader is told: who reads the slot, and what to do."""
    who = holder.describe() if holder is not None else "a session that has just ended"
    return (
        f"replication slot {slot!r} is in use: another reader holds its lock ({who}). Only "
        "one reader may use a slot at a time (two would write the same window to bronze "
        "twice), so this one stopped before reading and wrote nothing. Fix: let that run "
        "finish and run again (the schedule and the slot-lag sensor skip their ticks while "
        "it runs). If that process is gone, its session ends and frees the lock within about "
        "a minute; SELECT pg_terminate_backend(<pid>) on the source frees it at once. Give "
        "the Dagster pool 'pgcdc_slot' a limit of 1 so that runs queue instead.")


class SlotLease:
    """The slot's lock, held on a dedicated connection until :meth:`release`."""

    def __init__(self, dsn: str, slot: str, conn: psycopg2.extensions.connection) -> None:
        self.dsn = dsn
        self.slot = slot
        self._conn: psycopg2.extensions.connection | None = conn
        self._thread = threading.get_ident()

    @property
    def held(self) -> bool:
        return self._conn is not None

    @property
    def pid(self) -> int | None:
        return None if self._conn is None else int(self._conn.get_backend_pid())

    def verify(self) -> None:
        """Raise unless the lock session is still alive (then the lock is still ours).

        Called before anything this reader makes durable (a bronze commit, a slot advance):
        a session killed by the server or the network has lost the lock.
        """
        if self._conn is None:
            raise SlotInUseError(f"the lock of replication slot {self.slot!r} was released; "
                                 "this reader must not go on")
        try:
            with self._conn.cursor() as cur:
                cur.execute("SELECT 1")
        except psycopg2.Error:
            self.release()
            raise SlotInUseError(
                f"the session holding the lock of replication slot {self.slot!r} was lost "
                "(server restart, terminated backend or network); another reader may have "
                "taken the slot, so this run stops before committing anything more. Run "
                "again.") from None

    def release(self) -> None:
        """Close the lock session (which frees the lock) and forget the lease."""
        conn, self._conn = self._conn, None
        with _REGISTRY_LOCK:
            key = (self._thread, self.dsn, self.slot)
            if _REGISTRY.get(key) is self:
                del _REGISTRY[key]
        if conn is not None:
            try:
                conn.close()
            except psycopg2.Error:
                pass


_REGISTRY: dict[tuple[int, str, str], SlotLease] = {}
"""Leases held, by (thread, dsn, slot): what makes the lock re-entrant within a thread."""
_REGISTRY_LOCK = threading.Lock()


def current_lease(dsn: str, slot: str) -> SlotLease | None:
    """The lease this thread holds on ``slot``, if any."""
    with _REGISTRY_LOCK:
        return _REGISTRY.get((threading.get_ident(), dsn, slot))


def acquire(dsn: str, slot: str, run_id: str | None = None) -> SlotLease:
    """This thread's lease on ``slot``: the one it holds, or a new one.

    Raises:
        SlotInUseError: another session holds the lock (the message names it); nothing was
            read or written.
    """
    lease = current_lease(dsn, slot)
    if lease is not None:
        return lease
    name = f"{APPLICATION_PREFIX}{run_id}" if run_id else "pgcdc_dagster slot lock"
    conn = connect(dsn, application_name=name[:63])
    try:
        with conn.cursor() as cur:
            for setting, value in _SESSION_SETTINGS:
                try:
                    cur.execute("SELECT set_config(%s, %s, false)", (setting, value))
                except psycopg2.Error:  # older server without the setting: keep its default
                    pass
            taken, holder = _try_lock(cur, conn, slot)
    except BaseException:
        conn.close()
        raise
    if not taken:
        conn.close()
        raise SlotInUseError(in_use_message(slot, holder))
    lease = SlotLease(dsn, slot, conn)
    with _REGISTRY_LOCK:
        _REGISTRY[(lease._thread, dsn, slot)] = lease
    return lease


def _try_lock(cur: psycopg2.extensions.cursor, conn: psycopg2.extensions.connection,
              slot: str) -> tuple[bool, LockHolder | None]:
    """Take the lock, trying again for :data:`LOCK_GRACE_S` while another session holds it.

    Returns whether it was taken and, when not, the session that still holds it.
    """
    deadline = time.monotonic() + LOCK_GRACE_S
    while True:
        cur.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, lock_key(slot)))
        if bool(cur.fetchone()[0]):
            return True, None
        holder = lock_holder(conn, slot)
        if time.monotonic() >= deadline:
            return False, holder
        # None: the holder's session ended between the two queries; try again at once.
        time.sleep(0.02 if holder is None else 0.2)


@contextmanager
def lease_lent(lease: SlotLease | None) -> Iterator[None]:
    """Let the calling thread use ``lease``, held by another thread of the same reader, for
    the block: a worker thread doing the holder's work (the capture op reports events while
    its snapshot runs in a thread) is the same reader, not a second one. None: nothing to
    lend (the thread takes the lock itself)."""
    if lease is None:
        yield
        return
    key = (threading.get_ident(), lease.dsn, lease.slot)
    with _REGISTRY_LOCK:
        _REGISTRY[key] = lease
    try:
        yield
    finally:
        with _REGISTRY_LOCK:
            if _REGISTRY.get(key) is lease:
                del _REGISTRY[key]


@contextmanager
def slot_guard(dsn: str, slot: str, run_id: str | None = None) -> Iterator[SlotLease]:
    """Hold the slot's lock for the block (re-using this thread's lease when it has one).

    Raises:
        SlotInUseError: another reader holds it.
    """
    held = current_lease(dsn, slot)
    if held is not None:
        yield held
        return
    lease = acquire(dsn, slot, run_id)
    try:
        yield lease
    finally:
        lease.release()


@contextmanager
def slot_guard_or_reason(dsn: str, slot: str) -> Iterator[str | None]:
    """Like :func:`slot_guard` for readers that report instead of failing (asset checks):
    yields None while holding the lock, or the :func:`in_use_message` when another holds it."""
    if current_lease(dsn, slot) is not None:
        yield None
        return
    try:
        lease = acquire(dsn, slot)
    except SlotInUseError as exc:
        yield str(exc)
        return
    try:
        yield None
    finally:
        lease.release()
