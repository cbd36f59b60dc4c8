"""Chunk-reader errors the user can act on are named with their fix (issue 5, bad input)."""

from __future__ import annotations

import psycopg2

from pgcdc_dagster.exceptions import PgCdcError
from pgcdc_dagster.postgres.snapshot_read import _translate


def test_a_failed_buffer_allocation_names_memory_and_the_setting() -> None:
    for text in ("error with status PGRES_COPY_OUT and no message from the libpq",
                 "cannot allocate memory for input buffer"):
        out = _translate(psycopg2.DatabaseError(text), "public.big#0")
        assert isinstance(out, PgCdcError)
        assert str(out).startswith(f"public.big#0: {text}")
        assert "out of memory" in str(out) and "spark.executor.pyspark.memory" in str(out)


def test_other_errors_pass_through_unchanged() -> None:
    exc = psycopg2.OperationalError("server closed the connection unexpectedly")
    assert _translate(exc, "chunk") is exc
