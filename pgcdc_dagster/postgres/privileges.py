"""Privilege errors of the source, turned into errors that name the fix.

PostgreSQL says what is missing (``permission denied to start WAL sender``, ``must be owner of
table orders``) but not what to do about it in a CDC set-up. Capture needs:

* the ``REPLICATION`` attribute (replication connection, slot creation, peek, advance);
* to add tables to a publication (``publication.autocreate.mode = filtered``), ownership of
  those tables and ``CREATE`` on the database; ``FOR ALL TABLES`` needs a superuser;
* ``SELECT`` on every captured table (snapshots, checks).

:func:`check_capture_privileges` checks the first two up front, before a run changes anything
at the source (publication, slot), and names every shortfall with its fix in one error;
:func:`privileges_explained` turns a privilege error met later (a grant revoked meanwhile)
into the same kind of message.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import psycopg2
import psycopg2.errorcodes
import psycopg2.extensions

from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.names import display_name, quote_ident

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
USAGE_FIX = (
    "Fix: GRANT USAGE ON SCHEMA <schema> TO <capture user> (reading a table needs USAGE on "
    "its schema besides SELECT on the table), or exclude the schema's tables.")
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
    if "permission denied for schema" in text:
        return USAGE_FIX
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


def explain_error(exc: BaseException, redact: Callable[[str], str] = str) -> str:
    """``exc``'s message (through ``redact``), with the fix appended when it is a privilege
    error of the source: what a check or sensor shows instead of the raw server text."""
    text = redact(str(exc)).strip()
    if isinstance(exc, psycopg2.Error):
        fix = privilege_fix(exc.pgerror or str(exc))
        if fix is not None and exc.pgcode == psycopg2.errorcodes.INSUFFICIENT_PRIVILEGE:
            return f"the source refused: {redact(_first_line(exc))}. {fix}"
    elif "permission denied" in text.lower() and "Fix:" not in text:  # wrapped on the way
        fix = privilege_fix(text)
        if fix is not None:
            return f"{text} {fix}"
    return text


@dataclass(frozen=True)
class Shortfall:
    """One thing the capture user may not do, and how to allow it."""

    problem: str
    fix: str


_ROLE_SQL = """
SELECT current_user::text, current_database()::text, r.rolsuper,
       r.rolreplication OR EXISTS (
           SELECT 1 FROM pg_roles g
           WHERE g.rolname = 'rds_replication' AND pg_has_role(current_user, g.oid, 'MEMBER')),
       has_database_privilege(current_database(), 'CREATE')
FROM pg_roles r WHERE r.rolname = current_user
"""
_PUBLICATION_SQL = """
SELECT p.puballtables, pg_has_role(p.pubowner, 'USAGE'), pg_get_userbyid(p.pubowner)::text,
       ARRAY(SELECT ARRAY[t.schemaname::text, t.tablename::text]
             FROM pg_publication_tables t WHERE t.pubname = p.pubname)
FROM pg_publication p WHERE p.pubname = %s
"""
_NOT_OWNED_SQL = """
SELECT n.nspname, c.relname, pg_get_userbyid(c.relowner)::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = ANY(%s) AND NOT pg_has_role(c.relowner, 'USAGE')
ORDER BY 1, 2
"""


def capture_shortfalls(conn: psycopg2.extensions.connection, publication: str,
                       tables: Sequence[Relation], mode: str, *, prune: bool = False
                       ) -> list[Shortfall]:
    """What the connected user lacks to capture ``tables`` (REPLICATION; for
    ``publication.autocreate.mode`` ``filtered``: CREATE on the database when the
    publication is missing, ownership of the publication and of the tables it must add;
    ``all_tables``: superuser to create it). Empty when nothing is missing."""
    with conn.cursor() as cur:
        cur.execute(_ROLE_SQL)
        user, database, superuser, replication, can_create = cur.fetchone()
        if superuser:
            return []
        me = quote_ident(user)
        out = []
        if not replication:
            out.append(Shortfall(
                f"the role {me} has no REPLICATION attribute (needed for the replication "
                "slot, its snapshot and reading changes)",
                f"as a superuser: ALTER ROLE {me} WITH REPLICATION; on Amazon RDS/Aurora: "
                f"GRANT rds_replication TO {me}"))
        if mode not in ("filtered", "all_tables"):
            return out
        cur.execute(_PUBLICATION_SQL, (publication,))
        row = cur.fetchone()
        pub = quote_ident(publication)
        if row is None:
            if mode == "all_tables":
                out.append(Shortfall(
                    f"publication {pub} does not exist, and only a superuser can create it "
                    "FOR ALL TABLES", f"have a superuser run CREATE PUBLICATION {pub} FOR "
                    "ALL TABLES, or use publication.autocreate.mode = filtered"))
                return out
            if not can_create:
                out.append(Shortfall(
                    f"publication {pub} does not exist, and {me} may not create one in "
                    f"database {quote_ident(database)}",
                    f"GRANT CREATE ON DATABASE {quote_ident(database)} TO {me}; or have the "
                    f"tables' owner create it (CREATE PUBLICATION {pub} FOR TABLE ...) and "
                    "set publication.autocreate.mode = disabled"))
            present: set[tuple[str, str]] = set()
        else:
            all_tables, owner_ok, owner, listed = row
            if mode == "all_tables" or all_tables:
                return out
            present = {(str(s), str(t)) for s, t in listed}
            adding = [t for t in tables if t.qualified not in present]
            wanted = {t.qualified for t in tables}
            changes = bool(adding) or (prune and bool(tables) and bool(present - wanted))
            if changes and not owner_ok:
                out.append(Shortfall(
                    f"publication {pub} belongs to {quote_ident(owner)}, and {me} must change "
                    "it (add or drop captured tables)",
                    f"have {quote_ident(owner)} run the ALTER PUBLICATION and set "
                    f"publication.autocreate.mode = disabled, or ALTER PUBLICATION {pub} "
                    f"OWNER TO {me}"))
        missing = [t.oid for t in tables if t.qualified not in present]
        if missing:
            cur.execute(_NOT_OWNED_SQL, (missing,))
            rows = [(str(s), str(t), str(o)) for s, t, o in cur.fetchall()]
            if rows:
                names = ", ".join(display_name(s, t) for s, t, _ in rows)
                owners = sorted({o for _, _, o in rows})
                out.append(Shortfall(
                    f"adding {names} to publication {pub} needs ownership of "
                    f"{'it' if len(rows) == 1 else 'them'}, and {me} does not own "
                    f"{'it' if len(rows) == 1 else 'them'} (owner: "
                    f"{', '.join(quote_ident(o) for o in owners)})",
                    f"have the owner create or extend the publication (CREATE PUBLICATION "
                    f"{pub} FOR TABLE {names}, or ALTER PUBLICATION {pub} ADD TABLE {names}) "
                    "and set publication.autocreate.mode = disabled; or make the capture user "
                    f"the owner (ALTER TABLE {display_name(*rows[0][:2])} OWNER TO {me}, "
                    "likewise for each)"))
        return out


def check_capture_privileges(conn: psycopg2.extensions.connection, publication: str,
                             tables: Sequence[Relation], mode: str, *,
                             prune: bool = False) -> None:
    """Refuse a capture run up front (before anything is created at the source) when the
    user lacks what :func:`capture_shortfalls` lists, naming every shortfall and its fix.

    Raises:
        ConfigurationError: something is missing.
    """
    found = capture_shortfalls(conn, publication, tables, mode, prune=prune)
    if found:
        raise ConfigurationError(
            "the capture user lacks privileges the capture needs (nothing was changed at "
            "the source): " + " ".join(f"({i}) {s.problem}. Fix: {s.fix}."
                                        for i, s in enumerate(found, 1)))
