"""Replication slot and publication management: create, inspect, advance, drop.

DDL helpers are idempotent and compose identifiers with ``psycopg2.sql``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.exceptions import ConfigurationError, SlotInUseError, SlotLostError
from pgcdc_dagster.names import display_name, quote_ident
from pgcdc_dagster.postgres.connection import connect, connection
from pgcdc_dagster.postgres.discovery import replica_identity_fix, tables_without_replica_identity
from pgcdc_dagster.postgres.slot_wait import reporting_waits

WAL_END_SQL = ("CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
               "ELSE pg_current_wal_lsn() END")
"""The end of the WAL the server has: written on a primary, replayed on a standby (16+
decodes from a standby up to its replay position; ``pg_current_wal_lsn`` fails there)."""
FLUSH_END_SQL = ("CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
                 "ELSE pg_current_wal_flush_lsn() END")
"""The WAL logical decoding can read up to: flushed on a primary, replayed on a standby."""


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """State of a logical replication slot as ``pg_replication_slots`` reports it."""

    name: str
    plugin: str
    database: str
    active: bool
    active_pid: int | None
    restart_lsn: Lsn | None
    confirmed_flush_lsn: Lsn | None
    wal_status: str | None
    retained_bytes: int
    """WAL the slot keeps on the server: current WAL position minus ``restart_lsn``."""
    lag_bytes: int
    """Unconsumed WAL: current WAL position minus ``confirmed_flush_lsn``."""
    invalidation_reason: str | None = None
    """Why PostgreSQL invalidated the slot (17+; e.g. ``idle_timeout`` on 18)."""

    @property
    def usable(self) -> bool:
        """The slot still has its WAL (not lost or invalidated) and a confirmed point."""
        return (self.wal_status != "lost" and self.confirmed_flush_lsn is not None
                and self.invalidation_reason is None)


@dataclass(frozen=True, slots=True)
class ExportedSlot:
    """A freshly created slot and the snapshot exported at its consistent point."""

    name: str
    consistent_point: Lsn
    snapshot_name: str


def slot_info(conn: psycopg2.extensions.connection, slot: str) -> SlotInfo | None:
    """Return the slot's state, or None when it does not exist; raise
    :class:`ConfigurationError` when a slot of that name belongs to another database of the
    server (slot names are server-wide; streaming from it is impossible)."""
    with conn.cursor() as cur:
        cur.execute(
            """SELECT slot_name, plugin, database, active, active_pid, restart_lsn::text,
                      confirmed_flush_lsn::text, wal_status,
                      COALESCE(""" + WAL_END_SQL + """ - restart_lsn, 0)::bigint,
                      COALESCE(""" + WAL_END_SQL + """ - confirmed_flush_lsn, 0)::bigint,
                      current_database(), to_jsonb(s) ->> 'invalidation_reason'
               FROM pg_replication_slots s WHERE slot_name = %s""",
            (slot,),
        )
        row = cur.fetchone()
    if row is None:
        return None
    (name, plugin, database, active, pid, restart, confirmed, wal_status, retained, lag, db,
     reason) = row
    if database is not None and database != db:
        raise ConfigurationError(
            f"replication slot {slot!r} belongs to database {database!r}, not to the source "
            f"database {db!r}: slot names are shared by all databases of a server. Set "
            "PGCDC_SLOT (slot.name) to a name of its own for this source."
        )
    return SlotInfo(
        name, plugin or "", database or "", bool(active), pid,
        Lsn.parse(restart) if restart else None,
        Lsn.parse(confirmed) if confirmed else None,
        wal_status, int(retained), int(lag), reason,
    )


def require_usable_slot(conn: psycopg2.extensions.connection, slot: str,
                        plugin: str = "pgoutput") -> SlotInfo:
    """Return the slot's state; raise when it is missing, lost, of another plugin than
    ``plugin`` (``plugin.name``), or read by someone else."""
    info = slot_info(conn, slot)
    if info is None:
        raise SlotLostError(
            f"replication slot {slot!r} does not exist. Run the initial_snapshot job to create "
            "it (or set snapshot.mode = when_needed to re-snapshot automatically)."
        )
    if not info.usable:
        cause = ("it was inactive longer than idle_replication_slot_timeout"
                 if info.invalidation_reason == "idle_timeout" else "the WAL it needed was removed"
                 if info.invalidation_reason in (None, "wal_removed") else
                 f"invalidation_reason={info.invalidation_reason}")
        raise SlotLostError(
            f"replication slot {slot!r} is invalidated (wal_status={info.wal_status}): {cause}, "
            "so changes were lost. Drop the slot and run the initial_snapshot job again, or "
            "set snapshot.mode = when_needed to do both at the next run (a re-snapshot "
            "replaces silver)."
        )
    if info.plugin != plugin:
        raise ConfigurationError(
            f"replication slot {slot!r} uses plugin {info.plugin!r}, not {plugin} "
            "(plugin.name, PGCDC_PLUGIN_NAME); choose another PGCDC_SLOT, set the plugin the "
            "slot was created with, or drop that slot."
        )
    if info.active:
        raise SlotInUseError(
            f"replication slot {slot!r} is in use by another process (pid {info.active_pid}); "
            "only one reader may use a slot. Retry when that run has finished."
        )
    return info


def current_flush_lsn(conn: psycopg2.extensions.connection) -> Lsn:
    """The WAL position flushed to disk (replayed, on a standby): logical decoding never
    reads past it."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT ({FLUSH_END_SQL})::text")
        return Lsn.parse(cur.fetchone()[0])


def advance_slot(conn: psycopg2.extensions.connection, slot: str, lsn: Lsn) -> Lsn:
    """Move the slot's confirmed position to ``lsn`` (never backwards); return the new one."""
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)",
                (slot, str(lsn)),
            )
            return Lsn.parse(cur.fetchone()[0])
    except psycopg2.errors.ObjectInUse as exc:
        raise SlotInUseError(f"cannot advance slot {slot!r}: {exc.pgerror}") from None


FAILOVER_SLOTS_SERVER = 170000
"""PostgreSQL 17 added failover slots: a logical slot created with ``failover = true`` is
synchronized to the standbys that run ``sync_replication_slots = on``, so it survives a
promotion."""


def supports_failover_slots(server_version_num: int) -> bool:
    """Whether the server can create failover slots (PostgreSQL 17+)."""
    return server_version_num >= FAILOVER_SLOTS_SERVER


def failover_possible(dsn: str) -> bool:
    """Whether a slot created through ``dsn`` can be a failover slot: PostgreSQL 17+ and not
    a standby (a slot created on a standby cannot fail over)."""
    with connection(dsn) as conn:
        if not supports_failover_slots(conn.server_version):
            return False
        with conn.cursor() as cur:
            cur.execute("SELECT pg_is_in_recovery()")
            return not cur.fetchone()[0]


@contextmanager
def create_slot_with_snapshot(dsn: str, slot: str, plugin: str = "pgoutput",
                              report: Callable[[str], None] | None = None, *,
                              failover: bool = False) -> Iterator[ExportedSlot]:
    """Create a logical slot of ``plugin`` (``plugin.name``) with an exported snapshot; keep
    it valid until exit. While the creation waits for transactions open at the source, they
    are reported every few seconds to ``report`` (:mod:`~pgcdc_dagster.postgres.slot_wait`).

    With ``failover`` (``slot.failover``) the slot is a failover slot on PostgreSQL 17+
    (``CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export', FAILOVER)``); older servers and
    standbys (16+ decode on a standby) get an ordinary slot.

    The replication connection is held open (and idle) for the whole block: the exported
    snapshot can be imported with ``SET TRANSACTION SNAPSHOT`` only while it lives.
    """
    if failover:
        failover = failover_possible(dsn)
    conn = connect(dsn, replication=True, application_name="pgcdc_dagster snapshot")
    try:
        with conn.cursor() as cur:
            command = sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL {} EXPORT_SNAPSHOT")
            if failover:
                command = sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL {} "
                                  "(SNAPSHOT 'export', FAILOVER)")
            try:
                # it waits for the transactions open at the source: say which, meanwhile
                with reporting_waits(dsn, conn.info.backend_pid, slot, report=report):
                    cur.execute(command.format(sql.Identifier(slot),
                                               sql.Identifier(plugin)).as_string(conn))
            except psycopg2.errors.DuplicateObject:
                raise ConfigurationError(
                    f"replication slot {slot!r} already exists; a consistent initial snapshot "
                    "needs a new slot. Drop it (teardown job) or keep streaming from it."
                ) from None
            name, point, snapshot, _plugin = cur.fetchone()
        yield ExportedSlot(str(name), Lsn.parse(point), str(snapshot))
    finally:
        conn.close()


def drop_slot(conn: psycopg2.extensions.connection, slot: str) -> bool:
    """Drop the slot if it exists; True when one was dropped."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s", (slot,))
        return bool(cur.rowcount > 0)


def ensure_publication(conn: psycopg2.extensions.connection, name: str,
                       tables: Sequence[Relation], mode: str = "filtered", *,
                       prune: bool = False) -> None:
    """Create or extend the publication (``publication.autocreate.mode``, STR-29/30).

    ``filtered`` publishes the captured tables (adding missing ones; with ``prune``, and
    ``tables`` the whole capture set, dropping the others as Debezium's filtered mode sets the
    publication to the filtered tables), ``all_tables`` creates ``FOR ALL TABLES``,
    ``disabled`` only checks that the publication exists and holds every captured table.

    The project never makes the source's own writes fail (STR-45): it refuses to add a table
    without a replica identity to a publication that publishes updates or deletes, and to
    create ``FOR ALL TABLES`` while the database has such a table.

    Publications it creates, and one holding a captured partitioned table, publish via the
    partition root: pgoutput then names the captured root, not the partition a row is in.

    Raises:
        ConfigurationError: an unknown mode; ``disabled`` with a missing publication or one
            lacking captured tables; a table without a replica identity to be published.
    """
    with conn.cursor() as cur:
        cur.execute("SELECT puballtables, pubupdate OR pubdelete, pubviaroot FROM pg_publication "
                    "WHERE pubname = %s", (name,))
        row = cur.fetchone()
        partitioned = _partitioned(cur, tables)
        if mode == "disabled":
            if row is not None and partitioned and not row[2]:
                raise ConfigurationError(
                    f"publication {name!r} publishes the changes of the partitioned "
                    f"{', '.join(partitioned)} under its partitions' names, which are not "
                    "captured, and publication.autocreate.mode is 'disabled'. Fix: ALTER "
                    f"PUBLICATION {quote_ident(name)} SET (publish_via_partition_root = true); "
                    "or set the mode to 'filtered'."
                )
            if row is None:
                raise ConfigurationError(
                    f"publication {name!r} does not exist and publication.autocreate.mode is "
                    f"'disabled'. Create it (CREATE PUBLICATION {quote_ident(name)} FOR TABLE "
                    "...), or set the mode to 'filtered'."
                )
            lacking = [] if row[0] else _unpublished(cur, name, tables)
            if lacking:
                raise ConfigurationError(
                    f"publication {name!r} does not publish {', '.join(lacking)}, so their "
                    "changes would never be captured, and publication.autocreate.mode is "
                    f"'disabled'. Fix: ALTER PUBLICATION {quote_ident(name)} ADD TABLE "
                    f"{', '.join(lacking)}; or set the mode to 'filtered', or remove them "
                    "from the include list."
                )
            return
        ident = sql.Identifier(name)
        if mode == "all_tables":
            if row is None:
                _refuse_without_identity(conn, name, None, "FOR ALL TABLES")
                cur.execute(sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES " + _VIA_ROOT)
                            .format(ident))
            elif partitioned and not row[2]:
                _publish_via_root(cur, ident)
            return
        if mode != "filtered":
            raise ConfigurationError(
                "publication.autocreate.mode must be all_tables, disabled or filtered, "
                f"not {mode!r}"
            )
        if row is None:
            _refuse_without_identity(conn, name, tables, "filtered")
            wanted = [sql.Identifier(t.namespace, t.name) for t in tables]
            stmt = sql.SQL("CREATE PUBLICATION {} FOR TABLE {} " + _VIA_ROOT)
            cur.execute(stmt.format(ident, sql.SQL(", ").join(wanted)))
            return
        if partitioned and not row[2]:
            _publish_via_root(cur, ident)
        if row[0]:
            return
        cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                    (name,))
        present = {(str(s), str(t)) for s, t in cur.fetchall()}
        adding = [t for t in tables if (t.namespace, t.name) not in present]
        if adding and row[1]:
            _refuse_without_identity(conn, name, adding, "filtered")
        if adding:
            stmt = sql.SQL("ALTER PUBLICATION {} ADD TABLE {}")
            cur.execute(stmt.format(ident, sql.SQL(", ").join(
                sql.Identifier(t.namespace, t.name) for t in adding)))
        captured = {(t.namespace, t.name) for t in tables}
        extra = sorted(present - captured)
        if prune and extra and tables:
            stmt = sql.SQL("ALTER PUBLICATION {} DROP TABLE {}")
            cur.execute(stmt.format(ident, sql.SQL(", ").join(
                sql.Identifier(s, t) for s, t in extra)))


_VIA_ROOT = "WITH (publish_via_partition_root = true)"
"""Changes of a partition are published as the partitioned table's (the captured table)."""


def _partitioned(cur: psycopg2.extensions.cursor, tables: Sequence[Relation]) -> list[str]:
    """Display names of the partitioned tables among ``tables``."""
    if not tables:
        return []
    cur.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE c.relkind = 'p' AND (n.nspname, c.relname) "
                "IN %s ORDER BY 1, 2", (tuple((t.namespace, t.name) for t in tables),))
    return [display_name(str(s), str(t)) for s, t in cur.fetchall()]


def _publish_via_root(cur: psycopg2.extensions.cursor, ident: sql.Identifier) -> None:
    """Publish partitions' changes under their root's name (a captured partitioned table)."""
    cur.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)")
                .format(ident))


def _unpublished(cur: psycopg2.extensions.cursor, name: str,
                 tables: Sequence[Relation]) -> list[str]:
    cur.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (name,))
    present = {(str(s), str(t)) for s, t in cur.fetchall()}
    return [display_name(t.namespace, t.name) for t in tables
            if (t.namespace, t.name) not in present]


def _refuse_without_identity(conn: psycopg2.extensions.connection, name: str,
                             tables: Sequence[Relation] | None, how: str) -> None:
    """Raise when publishing ``tables`` (None: every table) would break the source's writes."""
    names = None if tables is None else [(t.namespace, t.name) for t in tables]
    bad = tables_without_replica_identity(conn, names)
    if not bad:
        return
    listed = ", ".join(f"{display_name(s, t)} (REPLICA IDENTITY {_IDENTITY_NAMES.get(r, r)})"
                       for s, t, r in bad)
    fixes = "; ".join(replica_identity_fix(s, t) for s, t, _ in bad)
    scope = ("a publication FOR ALL TABLES would include " if tables is None
             else f"publication {name!r} would include ")
    raise ConfigurationError(
        f"{scope}{listed}, which has no replica identity: PostgreSQL would then refuse every "
        "UPDATE and DELETE on it (\"cannot update table ... because it does not have a "
        "replica identity and publishes updates\"), so the project does not publish it. "
        f"Fix: {fixes}; a keyless table keyed by message.key.columns needs REPLICA IDENTITY "
        "FULL. Or exclude it from the include list"
        + (", or use publication.autocreate.mode = filtered." if how == "FOR ALL TABLES"
           else ".")
    )


_IDENTITY_NAMES = {"n": "NOTHING", "d": "DEFAULT, no primary key", "i": "USING INDEX, "
                   "index missing", "f": "FULL"}


def drop_publication(conn: psycopg2.extensions.connection, name: str) -> None:
    """Drop the publication if it exists."""
    with conn.cursor() as cur:
        cur.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))
