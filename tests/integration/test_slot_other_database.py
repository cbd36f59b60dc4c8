"""A slot of the configured name in another database of the same server (slot names are
server-wide, the default is ``pgcdc`` for every source) is refused with an error naming the fix,
before the capture snapshots or writes anything. Found by QA: the initial_snapshot took a full
snapshot "for the existing slot", wrote bronze and silver, then failed peeking the slot with
PostgreSQL's "replication slot ... was not created in this database"."""

from __future__ import annotations

import pytest

from pgcdc_dagster.capture.runner import run_bronze
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.slot import slot_info
from tests.integration.test_snapshot import SCHEMA, settings_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_slot_of_another_database_is_refused(pg_dsn, second_pg_dsn, spark, lakehouse) -> None:
    with connection(pg_dsn) as other:
        with other.cursor() as cur:
            cur.execute("SELECT pg_create_logical_replication_slot('snap', 'pgoutput')")
        assert slot_info(other, "snap") is not None  # its own database still sees it
    with connection(second_pg_dsn) as conn:
        with conn.cursor() as cur:
            cur.execute(SCHEMA)
        with pytest.raises(ConfigurationError, match=r"belongs to database .*PGCDC_SLOT"):
            slot_info(conn, "snap")
    with pytest.raises(ConfigurationError, match="PGCDC_SLOT"):
        run_bronze(settings_for(second_pg_dsn, lakehouse), spark, force_snapshot_step=True)
    # Nothing of the tables was written (the schema history of bronze/_pgcdc may be).
    assert not (lakehouse / "bronze" / "public").exists()
    assert not (lakehouse / "silver").exists()
