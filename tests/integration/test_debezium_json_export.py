"""Debezium JSON export of a real capture (an export of an
insert, update, delete and truncate event has exactly the field names, types and schema names
of Debezium's PostgreSQL events).

The seeds' customers table (000 §7.3.1) captured by snapshot and stream; expected layouts are
the seeds' examples (EVT-08, EVT-21..25) as the JsonConverter writes them, with D-05 (string
``snapshot``), D-06 (``sequence``) and D-11 (``<prefix>.<schema>.<table>``) resolved.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.cdc.debezium_json import FORMATS, table_codec
from pgcdc_dagster.export import export_table, main
from pgcdc_dagster.lake.paths import table_uri

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PREFIX = "PostgreSQL_server"


def f(kind: str, name: str, optional: bool = False) -> dict:
    return {"type": kind, "optional": optional, "field": name}


NOT_NULL = False
"""``optional`` of a NOT NULL column: Debezium writes false (EVT-08/09), and so does the
export (``build_context`` builds NOT NULL columns' converters required)."""

SERIAL_ID = {"type": "int32", "optional": False, "default": 0, "field": "id"}
"""A SERIAL key: its ``nextval(...)`` default is a function call, which Debezium propagates as
the type's zero (TYPE-21; its own tests expect ``default 0`` for serial columns). The seeds'
example predates default propagation and shows no ``default``."""

KEY_SCHEMA = {"type": "struct", "fields": [SERIAL_ID], "optional": False,
              "name": "PostgreSQL_server.public.customers.Key"}
ROW_FIELDS = [SERIAL_ID, f("string", "first_name", NOT_NULL),
              f("string", "last_name", NOT_NULL), f("string", "email", NOT_NULL)]
SOURCE_FIELDS = [
    f("string", "version"), f("string", "connector"), f("string", "name"), f("int64", "ts_ms"),
    {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
     "parameters": {"allowed": FORMATS["3.6"].snapshot_allowed}, "default": "false",
     "field": "snapshot"},
    f("string", "db"), f("string", "sequence", True), f("int64", "ts_us", True),
    f("int64", "ts_ns", True), f("string", "schema"), f("string", "table"),
    f("int64", "txId", True), f("int64", "lsn", True), f("int64", "xmin", True),
    f("string", "origin", True), f("int64", "origin_lsn", True),  # Debezium 3.6
]


def envelope(table: str, row_fields: list[dict]) -> dict:
    stem = f"{PREFIX}.public.{table}"
    return {
        "type": "struct",
        "fields": [
            {"type": "struct", "fields": row_fields, "optional": True, "name": f"{stem}.Value",
             "field": "before"},
            {"type": "struct", "fields": row_fields, "optional": True, "name": f"{stem}.Value",
             "field": "after"},
            {"type": "struct", "fields": SOURCE_FIELDS, "optional": False,
             "name": "io.debezium.connector.postgresql.Source", "version": 1,
             "field": "source"},
            {"type": "struct", "fields": [f("string", "id"), f("int64", "total_order"),
                                          f("int64", "data_collection_order")],
             "optional": True, "name": "event.block", "version": 1, "field": "transaction"},
            f("string", "op"), f("int64", "ts_ms", True), f("int64", "ts_us", True),
            f("int64", "ts_ns", True),
        ],
        "optional": False, "name": f"{stem}.Envelope", "version": 2,
    }


PRICE_FIELDS = [
    f("int32", "id", NOT_NULL),
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "10"},
     "field": "amount"},
    f("float", "ratio", True),  # JsonConverter writes FLOAT32 as "float"
    {"type": "array", "items": {"type": "string", "optional": True}, "optional": True,
     "field": "tags"},
    f("bytes", "raw", True),
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp",
     "version": 1, "field": "at"},
]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def captured(pg_dsn, pg_conn, spark, lakehouse):
    with pg_conn.cursor() as cur:
        cur.execute("""
            CREATE TABLE customers (id SERIAL, first_name VARCHAR(255) NOT NULL,
                last_name VARCHAR(255) NOT NULL, email VARCHAR(255) NOT NULL, PRIMARY KEY(id));
            CREATE TABLE prices (id int PRIMARY KEY, amount numeric(10,2), ratio real,
                tags text[], raw bytea, at timestamptz);
            ALTER TABLE prices REPLICA IDENTITY FULL;
            CREATE TABLE docs (id int PRIMARY KEY, n int, body text);
            ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL, REPLICA IDENTITY FULL;
            CREATE TABLE notes (LIKE docs INCLUDING ALL);  -- REPLICA IDENTITY DEFAULT
            INSERT INTO docs SELECT g, g, repeat(g::text, 9000) FROM generate_series(1, 2) g;
            INSERT INTO notes SELECT * FROM docs;
            INSERT INTO customers (first_name, last_name, email)
                VALUES ('Anne', 'Kretchmar', 'annek@noanswer.org');
            INSERT INTO prices VALUES (1, 12.34, 1.1, '{a,NULL}', '\\x00ff',
                '2018-06-20 15:13:16.945104+00');
        """)
        cur.execute("SELECT current_database()")
        db = cur.fetchone()[0]
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                               slot="dbzjson", publication="dbzjson", topic_prefix=PREFIX,
                               tombstones_on_delete=True, provide_transaction_metadata=True)
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO customers (first_name, last_name, email) "
                    "VALUES ('Bob', 'Builder', 'bob@example.org')")
        cur.execute("UPDATE customers SET first_name = 'Anne Marie' WHERE id = 1")
        cur.execute("SELECT pg_logical_emit_message(true, 'foo', 'bar')")
        cur.execute("COMMIT")
        cur.execute("UPDATE prices SET amount = 20.00, tags = '{}' WHERE id = 1")
        cur.execute("DELETE FROM customers WHERE id = 1")
        cur.execute("SELECT pg_logical_emit_message(false, 'foo', '\\x00ff'::bytea)")
        cur.execute("TRUNCATE prices")
        for table in ("docs", "notes"):  # the TOAST column unchanged, then a key change
            cur.execute(f"UPDATE {table} SET n = 10 WHERE id = 1")
            cur.execute(f"UPDATE {table} SET id = 3 WHERE id = 2")
    run_bronze(settings, spark, force_snapshot_step=False)
    return settings, db


def test_customers_events_have_debezium_layout(captured):
    settings, db = captured
    records = list(export_table(settings.lakehouse, "public", "customers",
                                transaction_metadata=True))
    ops = [r.value["payload"]["op"] if r.value else None for r in records]
    assert ops == ["r", "c", "u", "d", None]
    snap, create, update, delete, tomb = records
    for record in records:
        assert record.topic == "PostgreSQL_server.public.customers"
        assert record.key["schema"] == KEY_SCHEMA
        assert list(record.key["schema"]) == ["type", "fields", "optional", "name"]
        if record.value is not None:
            assert record.value["schema"] == envelope("customers", ROW_FIELDS)
            assert list(record.value["payload"]) == [
                "before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
            src = record.value["payload"]["source"]
            assert list(src) == [x["field"] for x in SOURCE_FIELDS]
            assert (src["connector"], src["name"], src["db"], src["schema"], src["table"]) == \
                ("postgresql", PREFIX, db, "public", "customers")
            assert src["ts_ns"] == src["ts_us"] * 1000 and src["ts_us"] // 1000 == src["ts_ms"]
            assert isinstance(src["lsn"], int) and len(json.loads(src["sequence"])) == 2
            _assert_jackson_sequence(src)
            payload = record.value["payload"]
            assert payload["ts_us"] == payload["ts_ms"] * 1000
    anne = {"id": 1, "first_name": "Anne", "last_name": "Kretchmar",
            "email": "annek@noanswer.org"}
    # EVT-21 (snapshot read, op r)
    assert snap.key["payload"] == {"id": 1}
    assert snap.value["payload"]["after"] == anne and snap.value["payload"]["before"] is None
    assert snap.value["payload"]["source"]["snapshot"] in ("true", "first", "last",
                                                           "first_in_data_collection",
                                                           "last_in_data_collection")
    assert snap.value["payload"]["transaction"] is None
    # insert
    c = create.value["payload"]
    assert create.key["payload"] == {"id": 2}
    assert c["after"] == {"id": 2, "first_name": "Bob", "last_name": "Builder",
                          "email": "bob@example.org"}
    assert c["source"]["snapshot"] == "false" and isinstance(c["source"]["txId"], int)
    commit_lsn = json.loads(c["source"]["sequence"])[0]
    assert c["transaction"]["id"] == f"{c['source']['txId']}:{commit_lsn}"
    assert c["transaction"]["total_order"] == 1
    # EVT-22: REPLICA IDENTITY DEFAULT and an unchanged key: pgoutput sends no old tuple
    u = update.value["payload"]
    assert u["before"] is None and u["after"] == {**anne, "first_name": "Anne Marie"}
    assert u["source"]["txId"] == c["source"]["txId"]
    assert u["transaction"]["total_order"] == 2
    # EVT-23: the old key (the NOT NULL fallbacks of the other columns: see below)
    d = delete.value["payload"]
    assert d["before"]["id"] == 1 and set(d["before"]) == {x["field"] for x in ROW_FIELDS}
    assert d["after"] is None and delete.key["payload"] == {"id": 1}
    # STR-71: the tombstone
    assert tomb.key == delete.key and tomb.value is None


def _assert_jackson_sequence(source: dict) -> None:
    """``source.sequence`` as Debezium's Jackson writes the list: no space after the comma
    (seed 000: ``"[\\"24023119\\",\\"24023128\\"]"``); a snapshot's first item null."""
    sequence = source["sequence"]
    assert sequence == json.dumps(json.loads(sequence), separators=(",", ":")), sequence
    if source["snapshot"] not in ("false", "incremental"):
        assert sequence == f'[null,"{source["lsn"]}"]', sequence


def test_not_null_columns_are_required(captured):
    """EVT-08/09: Debezium's schemas of NOT NULL columns (and so of primary keys) are
    required."""
    settings, _ = captured
    record = next(export_table(settings.lakehouse, "public", "customers"))
    assert record.key["schema"]["fields"] == [SERIAL_ID]  # read from the bronze Delta schema
    assert record.value["schema"]["fields"][1]["fields"] == [
        SERIAL_ID, f("string", "first_name"), f("string", "last_name"),
        f("string", "email")]


def test_delete_before_image_has_not_null_fallbacks(captured):
    """EVT-23 under REPLICA IDENTITY DEFAULT: the key, and the other (NOT NULL) columns as
    their type's zero, as Debezium's ``convertValue`` writes them."""
    settings, _ = captured
    records = list(export_table(settings.lakehouse, "public", "customers"))
    delete = next(r for r in records if r.value and r.value["payload"]["op"] == "d")
    assert delete.value["payload"]["before"] == {"id": 1, "first_name": "", "last_name": "",
                                                 "email": ""}


def test_column_values_truncate_and_full_identity(captured):
    settings, _ = captured
    records = list(export_table(settings.lakehouse, "public", "prices"))
    ops = [r.value["payload"]["op"] for r in records]
    assert ops == ["r", "u", "t"]
    snap, update, truncate = records
    assert snap.value["schema"] == envelope("prices", PRICE_FIELDS)
    row = {"id": 1, "amount": base64.b64encode((1234).to_bytes(2, "big")).decode(),
           "ratio": 1.1, "tags": ["a", None], "raw": "AP8=", "at": "2018-06-20T15:13:16.945104Z"}
    assert snap.value["payload"]["after"] == row
    # REPLICA IDENTITY FULL: the whole old row (STR-42)
    u = update.value["payload"]
    assert u["before"] == row
    assert u["after"] == {**row, "amount": base64.b64encode((2000).to_bytes(2, "big")).decode(),
                          "tags": []}
    assert u["transaction"] is None  # provide.transaction.metadata off in this export
    # EVT-16 / STR-53: no key; the value holds source, op and ts_ms only
    assert truncate.key is None
    t = truncate.value["payload"]
    assert truncate.value["schema"] == envelope("prices", PRICE_FIELDS)
    assert t["before"] is None and t["after"] is None and t["op"] == "t"
    assert {k for k, v in t.items() if v is not None} == {"source", "op", "ts_ms", "ts_us",
                                                          "ts_ns"}
    assert t["source"]["table"] == "prices" and isinstance(t["source"]["txId"], int)


def test_messages_and_transactions(captured):
    settings, _ = captured
    messages = list(export_table(settings.lakehouse, "_pgcdc", "messages"))
    assert [m.value["payload"]["message"] for m in messages] == [
        {"prefix": "foo", "content": "YmFy"},  # b"bar": EVT-25's "Ymfy" is illustrative (D-22)
        {"prefix": "foo", "content": "AP8="}]
    transactional, plain = messages
    for record in messages:
        assert record.topic == "PostgreSQL_server.message"
        assert record.key == {
            "schema": {"type": "struct", "fields": [f("string", "prefix", True)],
                       "optional": False, "name": "io.debezium.connector.postgresql.MessageKey",
                       "version": 1},
            "payload": {"prefix": "foo"}}
        value = record.value
        assert value["schema"]["name"] == "io.debezium.connector.postgresql.MessageValue"
        assert [x["field"] for x in value["schema"]["fields"]] == [
            "op", "ts_ms", "source", "transaction", "message"]  # Debezium 3.6
        src = value["payload"]["source"]
        assert (src["schema"], src["table"], src["snapshot"]) == ("", "", "false")
        assert value["payload"]["op"] == "m"
    for record in messages:
        _assert_jackson_sequence(record.value["payload"]["source"])
    assert isinstance(transactional.value["payload"]["source"]["txId"], int)
    assert plain.value["payload"]["source"]["txId"] is None
    hexed = list(export_table(settings.lakehouse, "_pgcdc", "messages", binary_mode="hex"))
    assert hexed[1].value["payload"]["message"]["content"] == "00ff"
    txs = list(export_table(settings.lakehouse, "_pgcdc", "transactions", topic_prefix=PREFIX))
    assert {t.value["payload"]["status"] for t in txs} == {"BEGIN", "END"}
    assert all(t.topic == "PostgreSQL_server.transaction" for t in txs)


def test_export_from_metadata_equals_export_from_converters(captured):
    settings, _ = captured
    ctx = next(c for c in load_contexts(settings) if c.relation.name == "prices")
    codec = table_codec(ctx.relation, ctx.converters, PREFIX)

    rows = DeltaTable(ctx.bronze_uri).to_pyarrow_table().sort_by("__commit_lsn").to_pylist()
    exported = list(export_table(settings.lakehouse, "public", "prices"))
    assert [codec.record(r) for r in rows] == exported
    # byte for byte: the schema history stores schemas with sorted keys, the export writes
    # them in JsonConverter's order (type ... field; Decimal's scale before its precision)
    assert [codec.record(r).to_json_line() for r in rows] == [e.to_json_line() for e in exported]
    assert '{"type":"int32","optional":false,"field":"id"}' in exported[0].to_json_line()


def test_command_line(captured, capsys):
    settings, _ = captured
    out = io.StringIO()
    assert main(["--lakehouse", settings.lakehouse, "--table", "public.customers",
                 "--limit", "2"], out=out) == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["value"]["payload"]["op"] for line in lines] == ["r", "c"]
    assert lines[0]["topic"] == "PostgreSQL_server.public.customers"
    assert lines[0]["key"]["payload"] == {"id": 1}
    out = io.StringIO()
    assert main(["--lakehouse", settings.lakehouse, "--table", "public.customers",
                 "--value-only", "--format", "2.7", "--topic-prefix", "other"], out=out) == 0
    values = [json.loads(line) for line in out.getvalue().splitlines()]
    assert values[-1] is None  # the tombstone
    assert values[0]["schema"]["name"] == "other.public.customers.Envelope"
    assert "version" not in values[0]["schema"]["fields"][2]
    assert main(["--lakehouse", settings.lakehouse, "--table", "public.nothere"]) == 2
    assert "no bronze table" in capsys.readouterr().err
    assert main(["--lakehouse", settings.lakehouse, "--table", "customers"]) == 2


def test_command_line_process_exits_cleanly(captured):
    """``python -m pgcdc_dagster.export`` as a shell runs it: status 0 and nothing on stderr
    each time (Arrow's reader threads aborted about 1 exit in 15 at finalization: status 134,
    'terminate called without an active exception'); a reader that goes away early (``|
    head -1``) ends it without a traceback."""
    settings, _ = captured
    command = [sys.executable, "-m", "pgcdc_dagster.export", "--lakehouse", settings.lakehouse,
               "--table", "public.customers"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(6):
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr[-2000:]
        assert len(proc.stdout.splitlines()) == 5
    with subprocess.Popen(["/bin/sh", "-c", " ".join(map(shlex.quote, command)) + " | head -1"],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as piped:
        out, err = piped.communicate(timeout=120)
    assert len(out.splitlines()) == 1 and "Traceback" not in err, err


def test_unchanged_toast_by_replica_identity(captured):
    """STR-48/49, TYPE-17: an unchanged TOAST column (``body``, 18 kB out of line) is in
    ``after`` like any column under REPLICA IDENTITY FULL (pgoutput sends the whole old row,
    yet marks the new row's column unchanged), and the placeholder under DEFAULT; a key
    change is a delete of the old key and a create of the new one (STR-73), whose ``body`` is
    likewise the value (FULL) or the placeholder (DEFAULT)."""
    settings, _ = captured
    body = {1: "1" * 9000, 2: "2" * 9000}
    for table, full in (("docs", True), ("notes", False)):
        records = list(export_table(settings.lakehouse, "public", table))
        # STR-73 with tombstones.on.delete: the old key's delete, its tombstone, the create
        assert [(r.key["payload"]["id"], r.value and r.value["payload"]["op"])
                for r in records] == [(1, "r"), (2, "r"), (1, "u"), (2, "d"), (2, None),
                                      (3, "c")]
        events = [(r.key["payload"]["id"], r.value["payload"]) for r in records if r.value]
        assert [(k, e["op"]) for k, e in events] == [(1, "r"), (2, "r"), (1, "u"), (2, "d"),
                                                     (3, "c")]
        _, update = events[2]
        _, delete = events[3]
        _, create = events[4]
        if full:
            assert update["before"] == {"id": 1, "n": 1, "body": body[1]}
            assert update["after"] == {"id": 1, "n": 10, "body": body[1]}
            assert delete["before"] == {"id": 2, "n": 2, "body": body[2]}
            assert create["after"] == {"id": 3, "n": 2, "body": body[2]}
        else:
            assert update["before"] is None
            assert update["after"] == {"id": 1, "n": 10, "body": "__debezium_unavailable_value"}
            assert delete["before"] == {"id": 2, "n": None, "body": None}
            assert create["after"] == {"id": 3, "n": 2, "body": "__debezium_unavailable_value"}
        # bronze records which columns it could not fill (silver keeps their stored value)
        bronze = DeltaTable(table_uri(settings.lakehouse, "bronze", "public", table))
        kept = [r["__toast_unchanged"] for r in bronze.to_pyarrow_table().to_pylist()
                if r["op"] in ("u", "c")]
        assert kept == ([None, None] if full else [["body"], ["body"]]), table
