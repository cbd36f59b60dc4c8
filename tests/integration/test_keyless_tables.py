"""``message.key.columns`` keys a table without primary key (CFG-38, EVT-05):
bronze keys, the export's Key schema and silver's MERGE key come from the option, for the
snapshot and the stream. Without the option such a table is refused with the fix.
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.exceptions import MissingPrimaryKeyError
from pgcdc_dagster.export import export_table
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _settings(pg_dsn, lakehouse, options=()) -> CaptureSettings:
    return CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.events",),
                           slot="keyless", publication="keyless", topic_prefix="srv",
                           column_options=options)


def test_keyless_table_is_keyed_by_message_key_columns(pg_dsn, pg_conn, spark, lakehouse):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE events (tenant int NOT NULL, seq int NOT NULL, body text)")
        cur.execute("ALTER TABLE events REPLICA IDENTITY FULL")
        cur.execute("INSERT INTO events SELECT g % 3, g, 'b' || g FROM generate_series(1, 30) g")
    with pytest.raises(MissingPrimaryKeyError, match=r"message\.key\.columns"):
        load_contexts(_settings(pg_dsn, lakehouse))
    settings = _settings(pg_dsn, lakehouse,
                         (("message.key.columns", "public.events:tenant,seq"),))
    (ctx,) = load_contexts(settings)
    assert ctx.relation.key_names == ("tenant", "seq")
    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)
    uri = table_uri(str(lakehouse), "silver", "public", "events")
    assert assert_silver_equals_source(pg_conn, uri, "public", "events", ["tenant", "seq"]) == 30
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO events VALUES (7, 100, 'new')")
        cur.execute("UPDATE events SET body = 'changed' WHERE seq = 4")
        cur.execute("UPDATE events SET seq = 200 WHERE seq = 5")  # a key change: d + c
        cur.execute("DELETE FROM events WHERE seq IN (6, 7)")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    assert assert_silver_equals_source(pg_conn, uri, "public", "events", ["tenant", "seq"]) == 29
    bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "events")
                        ).to_pyarrow_table()
    key_type = bronze.schema.field("key").type
    assert [key_type.field(i).name for i in range(key_type.num_fields)] == ["tenant", "seq"]
    events = sorted(bronze.to_pylist(), key=lambda r: (r["__commit_lsn"], r["__ordinal"]))
    assert [r["key"] for r in events if r["op"] == "r"][:2] == [{"tenant": 1, "seq": 1},
                                                                {"tenant": 2, "seq": 2}]
    streamed = [(r["op"], r["key"]) for r in events if r["op"] != "r"]
    assert streamed == [("c", {"tenant": 7, "seq": 100}), ("u", {"tenant": 1, "seq": 4}),
                        ("d", {"tenant": 2, "seq": 5}), ("c", {"tenant": 2, "seq": 200}),
                        ("d", {"tenant": 0, "seq": 6}), ("d", {"tenant": 1, "seq": 7})]
    records = list(export_table(str(lakehouse), "public", "events"))
    assert {tuple(f["field"] for f in r.key["schema"]["fields"]) for r in records} == \
        {("tenant", "seq")}
    assert records[-1].key["payload"] == {"tenant": 1, "seq": 7}
    assert records[-1].key["schema"]["fields"][0] == {"type": "int32", "optional": False,
                                                      "field": "tenant"}
