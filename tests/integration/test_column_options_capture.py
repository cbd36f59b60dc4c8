"""Column options through a real capture: bronze, silver and the export.

Seed-inventory IDs: CFG-36/37 and TYPE-16 (column lists; key columns always kept, EVT-06),
CFG-46/47 and TYPE-13/14 (truncate, mask), CFG-48 and TYPE-15 (propagate source type),
CFG-38 and EVT-05 (message.key.columns); hash masks follow Debezium's MaskStrings. The
options apply to every way a row reaches bronze: the initial snapshot, the stream and the
incremental snapshot (``capture/incremental.py``, source.snapshot = "incremental"); the
propagated source type (CFG-48) is in the export schema of snapshot and streamed events.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.incremental import apply_signal, run_incremental
from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.column_mappers import Hash, hash_value
from pgcdc_dagster.cdc.dblog import parse_signal
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.export import export_table
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.silver import live_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PEOPLE = """
CREATE TABLE people (id int PRIMARY KEY, tenant int NOT NULL, name text, ssn varchar(11),
                     note text, born date, score float8, secret text, email varchar(64));
INSERT INTO people VALUES
  (1, 10, 'Anne', '123-45-6789', 'a long note', '1980-05-17', 1.5, 's1', 'anne@example.org'),
  (2, 10, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  (3, 20, 'Bob', '987-65-4321', 'hi', '1999-12-31', -2.0, 's3', 'bob@example.org');
"""
PEOPLE_OPTIONS = (
    ("column.exclude.list", r"public\.people\.(secret|id)"),
    ("column.mask.with.5.chars", r"public\.people\.(ssn|score)"),
    ("column.truncate.to.4.chars", r"public\.people\.note"),
    ("column.mask.hash.SHA-256.with.salt.pepper", r"public\.people\.name"),
    ("column.mask.hash.v2.MD5.with.salt.pepper", r"public\.people\.email"),
    ("column.propagate.source.type", r"public\.people\.(born|tenant)"),
)
V1 = Hash("SHA-256", "pepper")


def v2(value: str) -> str:
    return hashlib.md5(b"pepper" + value.encode()).hexdigest()


def people_row(pid, tenant, name, ssn, note, born, score, email) -> dict:
    """The captured image of a people row: mapped values, ``secret`` left out."""
    return {"id": pid, "tenant": tenant, "name": None if name is None else hash_value(name, V1),
            "ssn": "*****", "note": None if note is None else note[:4], "born": born,
            "score": "*****", "email": None if email is None else v2(email)}


def _settings(pg_dsn, lakehouse, options, **kw) -> CaptureSettings:
    return CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                           slot="colopts", publication="colopts", column_options=options,
                           **kw)


def _bronze(lakehouse, table: str) -> pa.Table:
    return DeltaTable(table_uri(str(lakehouse), "bronze", "public", table)).to_pyarrow_table()


def _silver(lakehouse, table: str, key: str) -> list[dict]:
    return live_rows(table_uri(str(lakehouse), "silver", "public", table)).sort_by(
        key).to_pylist()


def _days(iso: str) -> int:
    import datetime

    return (datetime.date.fromisoformat(iso) - datetime.date(1970, 1, 1)).days


@pytest.fixture
def people(pg_dsn, pg_conn, spark, lakehouse):
    with pg_conn.cursor() as cur:
        cur.execute(PEOPLE)
    settings = _settings(pg_dsn, lakehouse, PEOPLE_OPTIONS)
    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)
    return settings


def test_snapshot_bronze_holds_mapped_values(people, lakehouse):
    bronze = _bronze(lakehouse, "people")
    rows = sorted(bronze.to_pylist(), key=lambda r: r["key"]["id"])
    assert [r["op"] for r in rows] == ["r", "r", "r"]
    assert rows[0]["after"] == people_row(1, 10, "Anne", "x", "a long note", _days("1980-05-17"),
                                          1.5, "anne@example.org")
    # a masked NULL is masked too (Debezium's MaskingValueConverter); hashes keep NULL
    assert rows[1]["after"] == people_row(2, 10, None, None, None, None, None, None)
    assert rows[0]["key"] == {"id": 1}  # the key column stays although the list excludes it
    after = bronze.schema.field("after").type
    assert [after.field(i).name for i in range(after.num_fields)] == \
        ["id", "tenant", "name", "ssn", "note", "born", "score", "email"]
    assert after.field("score").type == pa.string()
    # independent check of one hash (v1: salt + Java-serialised String)
    serialised = b"\xac\xed\x00\x05\x74\x00\x04Anne"
    assert rows[0]["after"]["name"] == hashlib.sha256(b"pepper" + serialised).hexdigest()


def test_snapshot_silver_holds_mapped_values(people, lakehouse):
    silver = _silver(lakehouse, "people", "id")
    assert [r["id"] for r in silver] == [1, 2, 3]
    assert "secret" not in silver[0]
    assert silver[0]["ssn"] == "*****" and silver[0]["score"] == "*****"
    assert silver[0]["note"] == "a lo" and silver[2]["note"] == "hi"
    assert silver[0]["name"] == hash_value("Anne", V1) and silver[1]["name"] is None
    assert silver[2]["email"] == v2("bob@example.org")
    assert str(silver[0]["born"]) == "1980-05-17"


def test_exported_schemas_carry_the_mapper_parameters(people):
    record = next(export_table(people.lakehouse, "public", "people"))
    fields = {x["field"]: x for x in record.value["schema"]["fields"][1]["fields"]}
    assert fields["ssn"] == {"type": "string", "optional": True,
                             "parameters": {"masked": "true"}, "field": "ssn"}
    assert fields["score"]["parameters"] == {"masked": "true"}
    assert fields["note"]["parameters"] == {"truncateLength": "4"}
    assert fields["born"] == {
        "type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1,
        "parameters": {"__debezium.source.column.type": "DATE",
                       "__debezium.source.column.length": "13",
                       "__debezium.source.column.scale": "0"},
        "field": "born"}
    assert fields["tenant"]["parameters"] == {"__debezium.source.column.type": "INT4",
                                              "__debezium.source.column.length": "10",
                                              "__debezium.source.column.scale": "0"}
    assert "secret" not in fields
    assert record.key["schema"]["fields"] == [{"type": "int32", "optional": False,
                                               "field": "id"}]  # NOT NULL (EVT-08)


PROPAGATED = {
    "born": {"__debezium.source.column.type": "DATE", "__debezium.source.column.length": "13",
             "__debezium.source.column.scale": "0"},
    "tenant": {"__debezium.source.column.type": "INT4",
               "__debezium.source.column.length": "10",
               "__debezium.source.column.scale": "0"},
}


def _value_fields(record) -> dict:
    return {x["field"]: x for x in record.value["schema"]["fields"][1]["fields"]}


def test_stream_applies_the_same_options(people, pg_conn, spark, lakehouse):
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO people VALUES (4, 30, 'Cleo', '111-22-3333', 'streamed note', "
                    "'2001-01-01', 3.25, 's4', 'cleo@example.org')")
        cur.execute("UPDATE people SET note = 'changed note', name = 'Anne Marie' WHERE id = 1")
        cur.execute("DELETE FROM people WHERE id = 3")
    run_bronze(people, spark, force_snapshot_step=False)
    run_silver(people, spark)
    bronze = [r for r in _bronze(lakehouse, "people").to_pylist() if r["op"] in ("c", "u")]
    by_id = {r["after"]["id"]: r["after"] for r in bronze}
    assert by_id[4] == people_row(4, 30, "Cleo", "x", "streamed note", _days("2001-01-01"),
                                  3.25, "cleo@example.org")
    assert by_id[1]["note"] == "chan" and by_id[1]["name"] == hash_value("Anne Marie", V1)
    assert "secret" not in by_id[1]
    silver = _silver(lakehouse, "people", "id")
    assert [r["id"] for r in silver] == [1, 2, 4]
    assert silver[0]["note"] == "chan" and silver[2]["ssn"] == "*****"
    # CFG-48 / TYPE-15 on streamed events' export schemas too, not only the snapshot's
    streamed = [r for r in export_table(people.lakehouse, "public", "people")
                if r.value is not None and r.value["payload"]["op"] in ("c", "u", "d")]
    assert {r.value["payload"]["op"] for r in streamed} == {"c", "u", "d"}
    for record in streamed:
        fields = _value_fields(record)
        for column, params in PROPAGATED.items():
            assert fields[column]["parameters"] == params, (record.value["payload"]["op"],
                                                            column)
        assert fields["ssn"]["parameters"] == {"masked": "true"}
        assert fields["note"]["parameters"] == {"truncateLength": "4"}
        assert "secret" not in fields
    insert = next(r for r in streamed if r.value["payload"]["op"] == "c")
    assert insert.value["payload"]["after"]["ssn"] == "*****"


def test_incremental_snapshot_applies_the_same_options(people, pg_conn, spark, lakehouse):
    """TYPE-13/14/16, CFG-36/37/46/47 and hashing masks on rows read by an incremental
    snapshot (DBLog chunks, ``op = r``, source.snapshot = "incremental")."""
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO people VALUES (5, 50, 'Dora', '555-55-5555', 'incremental', "
                    "'1970-01-02', 0.5, 's5', 'dora@example.org')")
    outcome = apply_signal(people, parse_signal(
        "inc1", "execute-snapshot", '{"data-collections": ["public.people"]}'), chunk_size=2)
    assert outcome.tables == ["public.people"]
    report = run_incremental(people)
    assert [t.status for t in report.tables] == ["done"]
    run_silver(people, spark)
    rows = [r for r in _bronze(lakehouse, "people").to_pylist()
            if r["op"] == "r" and str(r["source"]["snapshot"]) == "incremental"]
    by_id = {r["after"]["id"]: r["after"] for r in rows}
    assert sorted(by_id) == [1, 2, 3, 5]
    assert by_id[1] == people_row(1, 10, "Anne", "x", "a long note", _days("1980-05-17"), 1.5,
                                  "anne@example.org")
    assert by_id[2] == people_row(2, 10, None, None, None, None, None, None)
    assert by_id[5] == people_row(5, 50, "Dora", "x", "incremental", _days("1970-01-02"), 0.5,
                                  "dora@example.org")
    assert all("secret" not in a for a in by_id.values())
    silver = {r["id"]: r for r in _silver(lakehouse, "people", "id")}
    assert sorted(silver) == [1, 2, 3, 5]
    assert silver[5]["note"] == "incr" and silver[5]["ssn"] == "*****"
    assert silver[5]["name"] == hash_value("Dora", V1)
    assert silver[5]["email"] == v2("dora@example.org")
    assert "secret" not in silver[5]


ORDERS = """
CREATE TABLE orders (id int PRIMARY KEY, tenant int NOT NULL, code text NOT NULL, qty int,
                     note text);
ALTER TABLE orders REPLICA IDENTITY FULL;
INSERT INTO orders VALUES (1, 10, 'A-1', 5, 'n1'), (2, 10, 'A-2', 7, 'n2'),
                          (3, 20, 'A-1', 1, 'n3');
"""
ORDER_OPTIONS = (
    ("column.include.list", r"public\.orders\.qty"),
    ("message.key.columns", "public.orders:tenant,code"),
)


@pytest.fixture
def orders(pg_dsn, pg_conn, spark, lakehouse):
    with pg_conn.cursor() as cur:
        cur.execute(ORDERS)
    settings = _settings(pg_dsn, lakehouse, ORDER_OPTIONS)
    run_bronze(settings, spark, force_snapshot_step=True)
    run_silver(settings, spark)
    return settings


def test_custom_key_and_include_list_in_snapshot(orders, lakehouse):
    rows = sorted(_bronze(lakehouse, "orders").to_pylist(),
                  key=lambda r: (r["key"]["tenant"], r["key"]["code"]))
    assert [r["key"] for r in rows] == [{"tenant": 10, "code": "A-1"},
                                        {"tenant": 10, "code": "A-2"},
                                        {"tenant": 20, "code": "A-1"}]
    # the custom key's columns are kept, the old primary key is not (not in the list)
    assert rows[0]["after"] == {"tenant": 10, "code": "A-1", "qty": 5}
    silver = _silver(lakehouse, "orders", "qty")
    assert silver == [{"tenant": 20, "code": "A-1", "qty": 1},
                      {"tenant": 10, "code": "A-1", "qty": 5},
                      {"tenant": 10, "code": "A-2", "qty": 7}]
    record = next(export_table(orders.lakehouse, "public", "orders"))
    assert record.key["schema"] == {
        "type": "struct", "fields": [{"type": "int32", "optional": False, "field": "tenant"},
                                     {"type": "string", "optional": False, "field": "code"}],
        "optional": False, "name": "pgcdc.public.orders.Key"}


def test_custom_key_drives_the_stream_and_silver(orders, pg_conn, spark, lakehouse):
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE orders SET qty = 6 WHERE id = 1")
        cur.execute("UPDATE orders SET code = 'B-2' WHERE id = 2")  # a key change
        cur.execute("DELETE FROM orders WHERE id = 3")
    run_bronze(orders, spark, force_snapshot_step=False)
    run_silver(orders, spark)
    stream = [r for r in _bronze(lakehouse, "orders").to_pylist() if r["op"] != "r"]
    assert {(r["op"], r["key"]["tenant"], r["key"]["code"]) for r in stream if r["op"]} == {
        ("u", 10, "A-1"), ("d", 10, "A-2"), ("c", 10, "B-2"), ("d", 20, "A-1")}
    assert all(set(r["after"] or r["before"]) == {"tenant", "code", "qty"}
               for r in stream if r["op"])
    assert _silver(lakehouse, "orders", "qty") == [{"tenant": 10, "code": "A-1", "qty": 6},
                                                   {"tenant": 10, "code": "B-2", "qty": 7}]


def test_bad_options_fail_before_anything_is_captured(pg_dsn, pg_conn, spark, lakehouse):
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    settings = _settings(pg_dsn, lakehouse, (("column.mask.with.3.chars", r"public\.t\.id"),))
    with pytest.raises(ConfigurationError, match="key column"):
        run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'colopts'")
        assert cur.fetchone()[0] == 0
