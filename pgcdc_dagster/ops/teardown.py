"""Teardown: drop the replication slot and the publication, after an explicit confirmation.

The lakehouse is never touched: bronze keeps the history, silver the last state. Dropping
the slot releases the WAL it retains; capture can only resume with a new snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg2.errors

from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.exceptions import ConfigurationError, SlotInUseError
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.slot import drop_publication, drop_slot, slot_info
from pgcdc_dagster.postgres.slot_lock import slot_guard


@dataclass(frozen=True, slots=True)
class TeardownReport:
    """What the teardown dropped."""

    slot: str
    slot_dropped: bool
    slot_confirmed_lsn: Lsn | None
    """Where the slot was confirmed when dropped: bronze is complete up to here."""
    publication: str
    publication_dropped: bool
    retained_bytes_released: int


def check_confirmation(slot: str, confirm: str) -> None:
    """Raise unless ``confirm`` repeats the slot name exactly."""
    if confirm != slot:
        raise ConfigurationError(
            f"teardown not confirmed: set the run config 'confirm' to the slot name "
            f"{slot!r} (got {confirm!r}). Teardown drops replication slot {slot!r} and its "
            "publication; capture can only resume with a new initial snapshot. The lakehouse "
            "is not touched.")


def teardown(dsn: str, slot: str, publication: str, confirm: str, *,
             drop_publication_too: bool = True) -> TeardownReport:
    """Drop slot and (unless told not to) publication, after :func:`check_confirmation`."""
    check_confirmation(slot, confirm)
    with slot_guard(dsn, slot), connection(dsn) as conn:
        info = slot_info(conn, slot)
        if info is not None and info.active:
            raise SlotInUseError(
                f"replication slot {slot!r} is in use by pid {info.active_pid}; wait for that "
                "run to finish (or stop it) and run teardown again")
        try:
            dropped = drop_slot(conn, slot) if info is not None else False
        except psycopg2.errors.ObjectInUse as exc:
            raise SlotInUseError(f"cannot drop slot {slot!r}: {exc.pgerror}") from None
        pub_dropped = False
        if drop_publication_too:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
                exists = cur.fetchone() is not None
            if exists:
                drop_publication(conn, publication)
                pub_dropped = True
    return TeardownReport(
        slot=slot, slot_dropped=dropped,
        slot_confirmed_lsn=None if info is None else info.confirmed_flush_lsn,
        publication=publication, publication_dropped=pub_dropped,
        retained_bytes_released=0 if info is None else info.retained_bytes,
    )
