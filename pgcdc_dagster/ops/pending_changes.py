"""Count the changes a slot holds, without reading (or holding) the slot itself.

The slot-lag sensor needs the number of pending row changes, but the design allows one reader
per slot, and a run may take the slot at any moment. So the count is made on a *temporary copy*
(``pg_copy_logical_replication_slot(slot, copy, temporary => true)``): the copy starts at the
slot's ``restart_lsn`` / ``confirmed_flush_lsn``, belongs to this session only and vanishes
with it (it is also dropped explicitly). The real slot is never acquired, peeked or advanced.

The peek on the copy is bounded twice: by an explicit ``upto_lsn`` (the WAL position the caller
read) and by ``upto_nchanges``. pgoutput sends Begin, Commit and Relation rows besides the row
changes, so the row budget is ``3 × threshold + 64``: enough for ``threshold`` single-row
transactions. Protocol 2 with ``streaming`` on makes PostgreSQL hand out a transaction larger
than ``logical_decoding_work_mem`` in pieces, so even one huge transaction stops the peek near
the budget (its changes count although it has not committed yet: the figure is what the next
micro-batch will have to read, an upper bound when such a transaction aborts).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import psycopg2
from psycopg2 import sql

from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.pgoutput.options import publication_names_value
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.statements import execute

_CHANGE_TAGS = tuple(ord(c) for c in "IUDT")
"""pgoutput message types of row changes: Insert, Update, Delete, Truncate."""

_COUNT = sql.SQL(
    "SELECT count(*) FILTER (WHERE get_byte(data, 0) = ANY({})), count(*) "
    "FROM pg_logical_slot_peek_binary_changes({}, {}::pg_lsn, {}, "
    "'proto_version', '2', 'streaming', 'on', 'publication_names', {})").format(
    *(sql.Placeholder() for _ in range(5)))


def row_budget(threshold: int) -> int:
    """``upto_nchanges`` for a count that must reach ``threshold`` row changes."""
    return 3 * threshold + 64


@dataclass(frozen=True, slots=True)
class PendingChanges:
    """Row changes found in the slot's pending WAL, up to ``upto_lsn``, stopping at ``limit``."""

    changes: int
    rows: int
    """Every pgoutput row the peek returned (changes, begins, commits, relations)."""
    upto_lsn: Lsn
    budget: int
    """The ``upto_nchanges`` the peek ran with; ``rows >= budget`` means it stopped early."""

    @property
    def truncated(self) -> bool:
        return self.rows >= self.budget


def count_pending_changes(dsn: str, slot: str, publication: str, upto_lsn: Lsn,
                          threshold: int) -> PendingChanges:
    """Count the row changes the slot holds up to ``upto_lsn`` (at least ``threshold`` when
    there are that many), on a temporary copy of the slot.

    Raises:
        psycopg2.Error: the copy or the peek failed (slot missing or invalidated, no free
            replication slot for the copy, publication missing).
    """
    copy = f"pgcdc_count_{uuid.uuid4().hex[:16]}"
    budget = row_budget(threshold)
    with connection(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_copy_logical_replication_slot(%s, %s, true)", (slot, copy))
        try:
            execute(cur, _COUNT, (list(_CHANGE_TAGS), copy, str(upto_lsn), budget,
                                  publication_names_value([publication])))
            changes, rows = cur.fetchone()
        finally:
            try:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (copy,))
            except psycopg2.Error:
                pass  # temporary: PostgreSQL drops it when this session ends anyway
    return PendingChanges(int(changes), int(rows), upto_lsn, budget)
