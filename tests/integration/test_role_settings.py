"""Hostile role defaults cannot break a capture: the capture role has
``idle_in_transaction_session_timeout``, ``statement_timeout`` and ``lock_timeout`` of 1 ms
(``ALTER ROLE ... SET``), which would end the exported snapshot's connection and the chunk
readers (idle in their transactions between statements) and cancel every read. The
project's sessions start with their own values (``connection.SESSION_DEFAULTS``), so the
initial snapshot and the micro-batch after it run, and silver equals the source."""

from __future__ import annotations

import uuid

import psycopg2
import pytest
from psycopg2 import sql

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.postgres.connection import connect
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]

HOSTILE = {"idle_in_transaction_session_timeout": "1ms", "statement_timeout": "1ms",
           "lock_timeout": "1ms"}


def test_hostile_role_settings_do_not_break_the_snapshot(pg_dsn, pg_conn, spark,
                                                         lakehouse) -> None:
    role = f"hostile_{uuid.uuid4().hex[:8]}"
    with pg_conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER REPLICATION").format(
            sql.Identifier(role)))
        for name, value in HOSTILE.items():
            cur.execute(sql.SQL("ALTER ROLE {} SET {} = {}").format(
                sql.Identifier(role), sql.Identifier(name), sql.Literal(value)))
        cur.execute("CREATE TABLE r (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO r SELECT g, 'v' || g FROM generate_series(1, 3000) g")
    dsn = pg_dsn.replace("user=postgres", f"user={role}")
    plain = psycopg2.connect(dsn)  # what the role gets without the project's settings
    with plain.cursor() as cur:
        cur.execute("SHOW idle_in_transaction_session_timeout")
        assert cur.fetchone()[0] == "1ms"
    plain.close()
    own = connect(dsn)
    with own.cursor() as cur:
        cur.execute("SELECT current_setting('idle_in_transaction_session_timeout'), "
                    "current_setting('statement_timeout'), current_setting('lock_timeout')")
        assert cur.fetchone() == ("0", "0", "0")
    own.close()

    settings = CaptureSettings(dsn=dsn, lakehouse=str(lakehouse), include=("public\\.r",),
                               slot="hostile", publication="hostile")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE r SET v = 'changed' WHERE id % 7 = 0")
        cur.execute("DELETE FROM r WHERE id % 11 = 0")
        cur.execute("INSERT INTO r SELECT g, 'new' FROM generate_series(3001, 3100) g")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    uri = table_uri(str(lakehouse), "silver", "public", "r")
    assert assert_silver_equals_source(pg_conn, uri, "public", "r", ["id"]) == 3100 - 272
