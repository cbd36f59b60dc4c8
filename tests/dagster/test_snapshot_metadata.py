"""Bronze metadata of snapshots, and the LSN-window chain across a temporary-slot snapshot.

A table that joins the capture later is snapshotted by the next micro-batch through a
temporary exported-snapshot slot while the capture slot stays where it was (seed inventory
SNAP- items on snapshotting newly added tables). Its point must not restart the window chain:
before, the run recorded it as ``snapshot_lsn`` and the LSN-window check reported the slot as
having gone backwards. The bronze ``_pgcdc`` tables are assets too, reported by the runs
that write them.
"""

from __future__ import annotations

import dagster as dg
import pytest

from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]


def _defs(dsn: str, lakehouse: str, tables: list[tuple[str, str]]) -> dg.Definitions:
    return build_definitions(tables, {
        "postgres": PostgresResource(dsn=dsn),
        "lakehouse": LakehouseResource(root=lakehouse),
        "capture": CaptureResource(tables=r"public\.(items|late)", slot="dg_meta",
                                   publication="dg_meta"),
        "spark": SparkResource(),
    }, settings=MonitorSettings())


def _mats(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    out = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization  # type: ignore[union-attr]
        out["/".join(mat.asset_key.path)] = {k: v.value for k, v in mat.metadata.items()}
    return out


def _failed_checks(result: dg.ExecuteInProcessResult) -> dict[str, str | None]:
    return {f"{'/'.join(e.asset_key.path)}:{e.check_name}": e.description
            for e in result.get_asset_check_evaluations() if not e.passed}


def test_temporary_snapshot_keeps_the_window_chain(pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        cur.execute("INSERT INTO items SELECT g, 'i' || g FROM generate_series(1, 50) g")
    with dg.instance_for_test() as instance:
        first = _defs(pg_dsn, str(lakehouse), [("public", "items")])
        result = first.resolve_job_def("initial_snapshot").execute_in_process(instance=instance)
        assert result.success and not _failed_checks(result)
        items = _mats(result)["bronze/public/items"]
        assert items["slot_action"] == "create" and items["snapshot_lsn"] == \
            items["snapshot_point"]
        assert items["snapshot_rows"] == 50 and items["snapshot_resumed_chunks"] == 0
        assert "snapshot_table_lsn" in items and "snapshot_chunks_done" in items
        # Only what the run wrote is reported: the meta tables once they get events.
        assert set(_mats(result)) == {"bronze/public/items", "silver/public/items"}

        with pg_conn.cursor() as cur:  # the slot falls behind, then a table joins
            cur.execute("INSERT INTO items SELECT g, 'j' || g FROM generate_series(51, 80) g")
            cur.execute("CREATE TABLE late (id int PRIMARY KEY, v text)")
            cur.execute("INSERT INTO late SELECT g, 'l' || g FROM generate_series(1, 40) g")
            cur.execute("SELECT pg_logical_emit_message(true, 'app.note', 'hello')")
        second = _defs(pg_dsn, str(lakehouse), [("public", "items"), ("public", "late")])
        result = second.resolve_job_def("cdc_microbatch").execute_in_process(instance=instance)
        assert result.success
        mats = _mats(result)
        late, items = mats["bronze/public/late"], mats["bronze/public/items"]
        assert late["slot_action"] == "temporary" and late["snapshot_rows"] == 40
        assert "snapshot_lsn" not in late and "snapshot_lsn" not in items
        assert items["events_c"] == 30
        assert mats["bronze/_pgcdc/messages"]["events"] == 1
        assert not _failed_checks(result)  # bronze_lsn_windows of both tables pass
