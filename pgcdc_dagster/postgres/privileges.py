"""Privilege errors of the source, turned into errors that name the fix.

PostgreSQL says what is missing (``permission denied to start WAL sender``, ``must be owner of
table orders``) but not what to do about it in a CDC set-up. Capture needs:

* the ``REPLICATION`` attribute (replication connection, slot creation, peek, advance);
* to add tables to a publication (``publication.autocreate.mode = filtered``), ownership of
  those tables and ``CREATE`` on the database; ``FOR ALL TABLES`` needs a superuser;
* ``SELECT`` on every captured table (snapshots, checks).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import psycopg2
import psycopg2.errorcodes

from pgcdc_dagster.exceptions import ConfigurationError

P = ParamSpec("P")
R = TypeVar("R")

REPLICATION_FIX = (
    "Fix: give the capture user the REPLICATION attribute (as a superuser: ALTER ROLE "
    "<capture user> WITH REPLICATION; on Amazon RDS/Aurora: GRANT rds_replication TO "
    "<capture user>), or connect as a user that has it.")
OWNERSHIP_FIX = (
    "Adding a table to a publication needs ownership of the table. Fix: have the DBA create "
    "the publication (CREATE PUBLICATION <publication> FOR TABLE ...) and set "
    "publication.autocreate.mode = disabled so that capture only reads it, or make the "
    "capture user the tables' owner (ALTER TABLE ... OWNER TO <capture user>).")
CREATE_FIX = (
    "Creating a publication needs CREATE on the database. Fix: GRANT CREATE ON DATABASE "
    "<database> TO <capture user>, or have the DBA create the publication and set "
    "publication.autocreate.mode = disabled.")
ALL_TABLES_FIX = (
    "Only a superuser can create a FOR ALL TABLES publication. Fix: have a superuser create "
    "it, or use publication.autocreate.mode = filtered (the captured tables only).")
SELECT_FIX = (
    "Fix: GRANT SELECT ON <table> TO <capture user> (or GRANT SELECT ON ALL TABLES IN SCHEMA "
    "<schema> TO <capture user>), or exclude the table (table.exclude.list).")


def replication_fix(message: str) -> str | None:
    """The fix for a missing REPLICATION attribute, if ``message`` reports one."""
    text = message.lower()
    if ("replication role" in text or "replication attribute" in text
            or "wal sender" in text or "walsender" in text
            or ("replication slots" in text and "permission denied" in text)):
        return REPLICATION_FIX
    return None


def privilege_fix(message: str) -> str | None:
    """The fix for an ``insufficient_privilege`` error of the source (None: not known)."""
    text = message.lower()
    if "must be owner of table" in text or "must be owner of relation" in text \
            or "must be owner of publication" in text:
        return OWNERSHIP_FIX
    if "for all tables publication" in text:
        return ALL_TABLES_FIX
    if "permission denied for database" in text:
        return CREATE_FIX
    if "permission denied for table" in text or "permission denied for relation" in text:
        return SELECT_FIX
    return replication_fix(message)


def _first_line(exc: psycopg2.Error) -> str:
    return (exc.pgerror or str(exc)).strip().splitlines()[0] if (exc.pgerror or str(exc)) \
        else type(exc).__name__


@contextmanager
def privileges_explained() -> Iterator[None]:
    """Re-raise a known privilege error of the source as a ConfigurationError naming the fix."""
    try:
        yield
    except psycopg2.Error as exc:
        if exc.pgcode != psycopg2.errorcodes.INSUFFICIENT_PRIVILEGE:
            raise
        fix = privilege_fix(exc.pgerror or str(exc))
        if fix is None:
            raise
        raise ConfigurationError(f"the source refused: {_first_line(exc)}. {fix}") from exc


def explains_privileges(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator form of :func:`privileges_explained`."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with privileges_explained():
            return fn(*args, **kwargs)

    return wrapper
