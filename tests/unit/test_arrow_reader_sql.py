"""The Arrow reader renders ``psycopg2.sql`` compositions without a connection: identifiers
and literals from the source are quoted, never spliced; driver errors name their fix."""

from __future__ import annotations

import adbc_driver_manager
import pytest
from psycopg2 import sql

from pgcdc_dagster.exceptions import ConfigurationError, PgCdcError
from pgcdc_dagster.postgres.arrow_reader import quote_literal, render, translate
from pgcdc_dagster.postgres.snapshot_read import (
    Chunk,
    KeyColumn,
    SnapshotExpiredError,
    TableVanishedError,
    chunk_query,
)


def test_identifiers_and_literals_are_quoted() -> None:
    query = sql.SQL("SELECT {} FROM {} WHERE k >= {}").format(
        sql.Identifier('we"ird'), sql.Identifier("s c", "t;"), sql.Literal("it's \\ odd"))
    assert render(query) == ('SELECT "we""ird" FROM "s c"."t;" WHERE k >= '
                             "E'it''s \\\\ odd'")
    assert quote_literal(None) == "NULL" and quote_literal(3) == "3"
    assert quote_literal("plain") == "'plain'"
    with pytest.raises(ValueError):
        quote_literal("nul\x00")


def test_chunk_queries_render_their_bounds_as_literals() -> None:
    key = [KeyColumn("id", "bigint"), KeyColumn("name", "text")]
    chunk = Chunk("public", "t", 1, "key", ("5", "x'); DROP TABLE t; --"), None)
    text = render(chunk_query(chunk, ["id", "name"], key))
    assert text == ('SELECT "id", "name" FROM "public"."t" WHERE ("id", "name") >= '
                    "('5'::bigint, 'x''); DROP TABLE t; --'::text)")


def _error(cls: type, message: str, sqlstate: str) -> adbc_driver_manager.Error:
    return cls(message, status_code=adbc_driver_manager.AdbcStatusCode.UNKNOWN,
               sqlstate=sqlstate)


def test_driver_errors_are_named_with_their_fix() -> None:
    gone = translate(_error(adbc_driver_manager.ProgrammingError,
                            'INVALID_STATE: Failed to prepare query: ERROR:  relation "t" '
                            "does not exist\nQuery was: SELECT 1", "42P01"), "public.t#0")
    assert isinstance(gone, TableVanishedError)
    assert str(gone).startswith('public.t#0: relation "t" does not exist.')
    expired = translate(_error(adbc_driver_manager.ProgrammingError,
                               "ERROR:  invalid snapshot identifier", "22023"), "c")
    assert isinstance(expired, SnapshotExpiredError)
    writes = translate(_error(adbc_driver_manager.ProgrammingError, "ERROR:  cannot execute "
                              "nextval() in a read-only transaction", "25006"), "c")
    assert isinstance(writes, ConfigurationError) and "READ ONLY" in str(writes)
    slow = translate(_error(adbc_driver_manager.OperationalError, "ERROR:  canceling "
                            "statement due to statement timeout", "57014"), "c", 50)
    assert isinstance(slow, PgCdcError) and "statement_timeout 50 ms" in str(slow)
