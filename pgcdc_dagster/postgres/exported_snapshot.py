"""Consistent points: temporary slots with an exported snapshot, plain slots, and the
publication's tables."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.exceptions import PgCdcError
from pgcdc_dagster.postgres.connection import connect, connection
from pgcdc_dagster.postgres.slot_wait import reporting_waits

# --- consistent points -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ExportedPoint:
    """A slot's consistent point and the snapshot exported there."""

    slot: str
    lsn: int
    snapshot_name: str


@contextmanager
def temporary_exported_snapshot(dsn: str, slot: str) -> Iterator[ExportedPoint]:
    """A TEMPORARY logical slot with an exported snapshot, alive for the block.

    The snapshot shows exactly the transactions whose commit precedes the slot's consistent
    point; the temporary slot (dropped when its connection closes) only serves that export.
    """
    conn = connect(dsn, replication=True, application_name="pgcdc_dagster snapshot point")
    try:
        with conn.cursor() as cur, reporting_waits(dsn, conn.info.backend_pid, slot):
            cur.execute(sql.SQL("CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput "
                                "EXPORT_SNAPSHOT").format(sql.Identifier(slot)).as_string(conn))
            name, point, snapshot, _plugin = cur.fetchone()
        yield ExportedPoint(str(name), int(Lsn.parse(point)), str(snapshot))
    finally:
        conn.close()
        _wait_slot_dropped(dsn, slot)


def _wait_slot_dropped(dsn: str, slot: str, timeout_s: float = 10.0) -> None:
    """Wait until the server has dropped the closed session's temporary slot.

    The walsender drops it while exiting, a moment after the client closed the connection;
    callers (and users looking at ``pg_replication_slots``) must not see it pinning WAL
    after the snapshot is done. Best effort: a slow exit is left to the server.
    """
    deadline = time.monotonic() + timeout_s
    try:
        with connection(dsn) as check, check.cursor() as cur:
            while time.monotonic() < deadline:
                cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
                if cur.fetchone() is None:
                    return
                time.sleep(0.02)
    except (psycopg2.Error, PgCdcError):  # never hide the error the block may be raising
        return


def create_plain_slot(conn: psycopg2.extensions.connection, slot: str,
                      plugin: str = "pgoutput", *, failover: bool = False) -> int:
    """Create a logical slot of ``plugin`` without a snapshot (``no_data``); return its
    consistent point. ``failover``: a failover slot on PostgreSQL 17+ (``slot.failover``)."""
    with conn.cursor() as cur:
        if failover:  # 17+, and not on a standby (a standby's slot cannot fail over)
            cur.execute("SELECT current_setting('server_version_num')::int >= 170000 "
                        "AND NOT pg_is_in_recovery()")
            failover = bool(cur.fetchone()[0])
        if failover:
            cur.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s, "
                        "false, false, true)", (slot, plugin))
        else:
            cur.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s)",
                        (slot, plugin))
        return int(Lsn.parse(cur.fetchone()[0]))


def published_tables(conn: psycopg2.extensions.connection,
                     publication: str) -> set[tuple[str, str]] | None:
    """Tables of the publication (None for a FOR ALL TABLES publication or a missing one)."""
    with conn.cursor() as cur:
        cur.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s", (publication,))
        row = cur.fetchone()
        if row is None or row[0]:
            return None
        cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                    (publication,))
        return {(str(s), str(t)) for s, t in cur.fetchall()}
