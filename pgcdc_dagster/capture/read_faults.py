"""Faults while reading the slot, told plainly: what happened, whether anything was lost,
and what the next run does.

A psycopg2 error out of a slot read (the peek's COPY, or the statements around it) is
translated here when its cause is known:

- the connection went away (server restarted or crashed, the backend terminated with
  ``pg_terminate_backend``, the network dropped it): libpq often reports only ``error with
  status PGRES_COPY_OUT and no message from the libpq``.
  :class:`~pgcdc_dagster.exceptions.SourceConnectionLostError` says so, that nothing of the
  window was committed nor the slot advanced, and that the next run resumes from the slot's
  position once the server accepts connections (it is probed once to say which is the case);
- the publication the slot decodes with was dropped while changes were pending:
  PostgreSQL decodes each change with the catalog as of that change, so the changes written
  between the drop and a later ``CREATE PUBLICATION`` (which this project issues itself at
  the next run) can never be decoded with it: not automatically recoverable from this slot,
  since no publication covers them. :class:`~pgcdc_dagster.exceptions.PublicationMissingError`
  says so and names the way out: teardown, then a ``when_needed`` snapshot.
"""

from __future__ import annotations

import re

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.exceptions import (
    PublicationMissingError,
    SourceConnectionLostError,
    SourceUnavailableError,
)
from pgcdc_dagster.postgres.connection import connect, describe_dsn, redact
from pgcdc_dagster.postgres.dsn import scrub

_CAUSES = {
    "57P01": "the server terminated the reading session (pg_terminate_backend, or a server "
             "shutdown)",
    "57P02": "the server crashed or was stopped in immediate mode",
    "57P03": "the server is starting up or shutting down",
    "57P05": "the server ended the session after idle_session_timeout",
}


def connection_lost(exc: psycopg2.Error, conn: psycopg2.extensions.connection | None) -> bool:
    """True when ``exc`` means the session with the server is gone (not an SQL error)."""
    code = exc.pgcode or ""
    if code.startswith(("57P", "08")):
        return True
    if conn is not None and conn.closed:
        return True
    return code == "" and isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError)


def _cause(exc: psycopg2.Error, dsn: str) -> str:
    known = _CAUSES.get(exc.pgcode or "")
    said = scrub(redact(str(exc).strip()), dsn).splitlines()
    text = said[0] if said else type(exc).__name__
    if known is not None:
        return f"{known}: {text}"
    return ("the server closed the connection (a restart or crash, pg_terminate_backend, or "
            f"a network loss): {text}")


def _now(dsn: str) -> str:
    try:
        probe = connect(dsn, application_name="pgcdc_dagster probe")
    except SourceUnavailableError:
        return "it cannot be reached right now (restarting or down)"
    probe.close()
    return "it accepts connections again"


def lost_while_reading(exc: psycopg2.Error, dsn: str, slot: str,
                       position: Lsn | None) -> SourceConnectionLostError:
    """The error to raise for a connection lost while reading ``slot`` from ``position``."""
    where = f" from {position}" if position is not None else ""
    resume = f"from {position}" if position is not None else "from the slot's position"
    return SourceConnectionLostError(
        f"lost the connection to the source PostgreSQL ({describe_dsn(dsn)}) while reading "
        f"replication slot {slot!r}{where}: {_cause(exc, dsn)}; {_now(dsn)}. Nothing of "
        "this window was committed to bronze and the slot was not advanced, so nothing is "
        f"lost: the next run resumes {resume} by itself once the server accepts connections "
        "(windows a crash made the slot forget are skipped by bronze's committed offsets).")


_LSN_IN_CONTEXT = re.compile(r"associated LSN ([0-9A-Fa-f]+/[0-9A-Fa-f]+)")


def publication_missing(exc: psycopg2.Error, slot: str, publication: str,
                        position: Lsn | None) -> PublicationMissingError | None:
    """The error to raise when the slot's pending changes name a dropped publication."""
    message = (exc.pgerror or str(exc)).strip().splitlines()
    first = message[0] if message else ""
    if not (isinstance(exc, psycopg2.errors.UndefinedObject) and "publication" in first):
        return None
    found = _LSN_IN_CONTEXT.search(exc.diag.context or exc.pgerror or "")
    at = f" at {found.group(1)}" if found else ""
    since = f" since {position}" if position is not None else ""
    return PublicationMissingError(
        f"replication slot {slot!r} holds changes{since} that PostgreSQL cannot decode: "
        f"{first.removeprefix('ERROR:').strip()} (in the change{at}). Publication "
        f"{publication!r} was dropped while changes were pending; PostgreSQL decodes each "
        "change with the catalog as of that change, so a publication created again "
        "afterwards (as this project does at each run) does not cover the changes written "
        "before it, and every run from this slot fails here. Nothing was committed. Way "
        "out (docs/operations.md, Re-snapshot, new slot): run the teardown job (confirm: "
        f"{slot!r}), set PGCDC_SNAPSHOT_MODE=when_needed and run initial_snapshot: the slot "
        "and publication are created again and every table is snapshotted again, its "
        "silver replaced; bronze keeps its history.")
