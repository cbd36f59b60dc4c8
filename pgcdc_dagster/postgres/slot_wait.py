"""Say what slot creation waits for.

``CREATE_REPLICATION_SLOT`` (and ``pg_create_logical_replication_slot``) cannot return
before every transaction that holds a transaction ID at the source has ended: the consistent
point must lie after them. A long open transaction (a forgotten ``BEGIN`` in a psql session,
a batch job) therefore holds the initial snapshot back, silently. While the creation runs,
:func:`reporting_waits` checks every :data:`REPORT_EVERY_S` seconds, on a connection of its
own, which backends the creating session waits for (``pg_blocking_pids``) and logs each one:
pid, application, how long its transaction has been open, its state and its query.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg2

from pgcdc_dagster.exceptions import PgCdcError
from pgcdc_dagster.postgres.connection import connect

log = logging.getLogger(__name__)

REPORT_EVERY_S = 5.0
"""Seconds between two reports of the transactions slot creation waits for."""
QUERY_CHARS = 200
"""How much of a blocking backend's query a report quotes."""

_BLOCKERS = """
SELECT a.pid, a.application_name, a.state,
       floor(extract(epoch FROM now() - coalesce(a.xact_start, a.backend_start)))::bigint,
       left(regexp_replace(a.query, '\\s+', ' ', 'g'), %s)
FROM unnest(pg_blocking_pids(%s)) AS b(pid)
JOIN pg_stat_activity a ON a.pid = b.pid
ORDER BY a.xact_start NULLS LAST, a.pid
"""


def _age(seconds: int) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (f"{hours} h {minutes} min" if hours else
            f"{minutes} min {secs} s" if minutes else f"{secs} s")


def describe_blockers(rows: list[tuple[int, str, str, int, str]]) -> str:
    """One line per blocking backend: pid, application, transaction age, state, query."""
    return "; ".join(
        f"pid {pid} (application {app or '(none)'!r}, transaction open for {_age(age)}, "
        f"{state or 'unknown state'}, query: {query!r})"
        for pid, app, state, age, query in rows)


def _watch(dsn: str, pid: int, slot: str, done: threading.Event, every: float,
           report: Callable[[str], None]) -> None:
    conn = None
    waited = 0.0
    try:
        while not done.wait(every):
            waited += every
            if conn is None:
                conn = connect(dsn, application_name="pgcdc_dagster slot wait report")
            with conn.cursor() as cur:
                cur.execute(_BLOCKERS, (QUERY_CHARS, pid))
                rows = cur.fetchall()
            if rows and not done.is_set():
                pids = ", ".join(str(r[0]) for r in rows)
                report(
                    f"creating replication slot {slot!r} has waited {_age(int(waited))} for "
                    f"{len(rows)} transaction(s) open at the source: PostgreSQL starts the "
                    "slot (and the initial snapshot) only once every transaction holding a "
                    f"transaction ID when it began has ended. Waiting for: "
                    f"{describe_blockers(rows)}. End them (COMMIT or ROLLBACK in their "
                    f"session, or SELECT pg_terminate_backend(pid) for pid {pids}) and the "
                    "snapshot goes on.")
    except (psycopg2.Error, PgCdcError) as exc:  # a report must never fail the snapshot
        log.info("cannot tell what slot creation waits for: %s", str(exc).strip())
    finally:
        if conn is not None:
            conn.close()


@contextmanager
def reporting_waits(dsn: str, pid: int, slot: str, every: float = REPORT_EVERY_S,
                    report: Callable[[str], None] | None = None) -> Iterator[None]:
    """While the block runs (backend ``pid`` creating ``slot``), report every ``every``
    seconds the backends it waits for (to ``report``, a run's log; a warning of this
    module's logger by default); nothing when it waits for none."""
    done = threading.Event()
    thread = threading.Thread(target=_watch, args=(dsn, pid, slot, done, every,
                                                   report or log.warning),
                              name=f"pgcdc slot wait report {slot}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
