"""The publication dropped by an operator while changes are pending in the slot.

PostgreSQL decodes every change with the catalog as of that change: the changes written
after the drop name a publication that did not exist then, and the publication this project
creates again at the next run does not cover them. No run can read past them from this
slot, so the run refuses with :class:`PublicationMissingError` naming the cause and the way
out (not the raw ``publication "…" does not exist``); the documented way out (teardown, then
a ``when_needed`` snapshot) converges: silver equals the source, and the next micro-batch
is exact.
"""

from __future__ import annotations

import dataclasses

import pytest

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.exceptions import PublicationMissingError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.teardown import teardown
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_dropped_publication_is_refused_with_the_way_out(pg_dsn, pg_conn, spark,
                                                         lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE p (id int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO p SELECT g, 'v' FROM generate_series(1, 200) g")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.p",),
                               slot="pubdrop", publication="pubdrop")
    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE p SET v = 'before the drop' WHERE id <= 10")
        cur.execute("DROP PUBLICATION pubdrop")
        cur.execute("DELETE FROM p WHERE id BETWEEN 11 AND 20")
        cur.execute("INSERT INTO p VALUES (201, 'while dropped')")

    for _ in range(2):  # the same refusal every time, nothing committed
        with pytest.raises(PublicationMissingError) as err:
            run_bronze(settings, spark, force_snapshot_step=False)
    message = str(err.value)
    assert "replication slot 'pubdrop' holds changes since" in message
    assert 'publication "pubdrop" does not exist' in message
    assert "was dropped while changes were pending" in message
    assert "run the teardown job (confirm: 'pubdrop')" in message
    assert "PGCDC_SNAPSHOT_MODE=when_needed" in message

    teardown(pg_dsn, "pubdrop", "pubdrop", "pubdrop")
    again = dataclasses.replace(settings, snapshot_mode="when_needed")
    run_bronze(again, spark, force_snapshot_step=True)
    run_silver(again, spark)
    uri = table_uri(str(lakehouse), "silver", "public", "p")
    assert assert_silver_equals_source(pg_conn, uri, "public", "p", ["id"]) == 191
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE p SET v = 'after' WHERE id > 150")
        cur.execute("DELETE FROM p WHERE id <= 5")
    run_bronze(again, spark, force_snapshot_step=False)
    run_silver(again, spark)
    assert assert_silver_equals_source(pg_conn, uri, "public", "p", ["id"]) == 186
