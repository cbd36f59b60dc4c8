"""Debezium JSON export of bronze rows, on constructed bronze rows.

Fixtures are the seeds' literal examples (seed-inventory EVT-08, EVT-21..25, 000 §7.3) with the
seeds' own inconsistencies resolved as the inventory says (D-05 snapshot, D-06 sequence, D-11
schema names, D-22 message JSON); layouts the seeds do not show are Debezium 2.7/3.1 output.
"""

from __future__ import annotations

import base64
import json

import pyarrow as pa
import pytest

from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST, Column, Relation, TableChanges
from pgcdc_dagster.cdc.column_options import ColumnOptions
from pgcdc_dagster.cdc.debezium_json import (
    FORMATS,
    DebeziumRecord,
    adjust_schema_name,
    event_to_json,
    schema_from_json,
    table_codec,
    table_codec_from_bronze,
    topic_name,
)
from pgcdc_dagster.cdc.debezium_records import message_to_json, transaction_to_json
from pgcdc_dagster.cdc.envelope import SourceIdentity, bronze_from_changes, bronze_schema
from pgcdc_dagster.cdc.jackson import dumps, float32_value
from pgcdc_dagster.cdc.typeconv import PgType, TypeModes, converter_for
from pgcdc_dagster.exceptions import ConfigurationError

pytestmark = pytest.mark.unit

PREFIX = "PostgreSQL_server"
INT4 = PgType(23, "pg_catalog", "int4", "b", "N")
VARCHAR = PgType(1043, "pg_catalog", "varchar", "b", "S")
TEXT = PgType(25, "pg_catalog", "text", "b", "S")
VARCHAR_255 = 255 + 4

# The seeds' customers table (000 §7.3.1): every column NOT NULL, id the primary key.
CUSTOMERS = Relation(16400, "public", "customers", "d", (
    Column("id", 23, -1, True), Column("first_name", 1043, VARCHAR_255, False),
    Column("last_name", 1043, VARCHAR_255, False), Column("email", 1043, VARCHAR_255, False)))
TYPES = {23: INT4, 1043: VARCHAR}


def customers_converters(nullable: bool = False):
    return [converter_for(c.name, TYPES[c.type_oid], c.typmod, TypeModes(), nullable=nullable)
            for c in CUSTOMERS.columns]


def field(kind: str, name: str, optional: bool = False) -> dict:
    return {"type": kind, "optional": optional, "field": name}


# EVT-08, written as the JsonConverter writes it (the seed's "INT32", "index": "0" and
# "optional": "false" are the documentation's shorthand, not converter output).
SEED_KEY = {
    "schema": {"type": "struct", "fields": [field("int32", "id")], "optional": False,
               "name": "PostgreSQL_server.public.customers.Key"},
    "payload": {"id": 1},
}
SEED_ROW_FIELDS = [field("int32", "id"), field("string", "first_name"),
                   field("string", "last_name"), field("string", "email")]
# EVT-21's value schema, source block as printed in seed 000 (boolean snapshot, no sequence).
SEED_SOURCE_FIELDS = [
    field("string", "version"), field("string", "connector"), field("string", "name"),
    field("int64", "ts_ms"),
    {"type": "boolean", "optional": True, "default": False, "field": "snapshot"},
    field("string", "db"), field("string", "schema"), field("string", "table"),
    field("int64", "txId", True), field("int64", "lsn", True), field("int64", "xmin", True),
]
SEED_SOURCE = {"version": "2.3.4.Final", "connector": "postgresql", "name": PREFIX,
               "ts_ms": 1559033904863, "snapshot": True, "db": "postgres",
               "sequence": "[\"24023119\",\"24023128\"]", "schema": "public",
               "table": "customers", "txId": 555, "lsn": 24023128, "xmin": None}
ANNE = {"id": 1, "first_name": "Anne", "last_name": "Kretchmar",
        "email": "annek@noanswer.org"}


def bronze_source(**over) -> dict:
    src = {**SEED_SOURCE, "snapshot": "true", "ts_us": SEED_SOURCE["ts_ms"] * 1000}
    src.update(over)
    return src


def row(op, before=None, after=None, key=None, ts_ms=1559033904863, tx=None, **source):
    if key is None and (after or before) is not None:
        key = {"id": (after or before)["id"]}
    return {"key": key, "before": before, "after": after, "source": bronze_source(**source),
            "op": op, "ts_ms": ts_ms, "transaction": tx, "__commit_lsn": 1, "__ordinal": 1,
            "__toast_unchanged": None}


def codec(fmt: str = "3.1", nullable: bool = False):
    return table_codec(CUSTOMERS, customers_converters(nullable), PREFIX, fmt=fmt)


# --- key (EVT-04..08) --------------------------------------------------------------------

def test_key_matches_seed_example():
    record = codec().record(row("c", after=ANNE))
    assert record.key == SEED_KEY
    assert record.topic == "PostgreSQL_server.public.customers"


def test_truncate_has_null_key_and_only_source_op_ts():
    """EVT-16, STR-53: key null; value carries source, op, ts_ms (before/after null)."""
    record = codec().record(row("t", txId=556, lsn=46523128, ts_ms=1559033904961,
                                snapshot="false"))
    assert record.key is None
    payload = record.value["payload"]
    assert payload["before"] is None and payload["after"] is None
    assert {k for k, v in payload.items() if v is not None} == {"source", "op", "ts_ms", "ts_us",
                                                                "ts_ns"}
    assert payload["op"] == "t" and payload["ts_ms"] == 1559033904961
    assert payload["source"]["txId"] == 556 and payload["source"]["lsn"] == 46523128


def test_tombstone_has_key_and_null_value():
    """STR-71/72: the tombstone after a delete keeps the key, its value is null."""
    tomb = row(None, key={"id": 1})
    record = codec().record(tomb)
    assert record.key == SEED_KEY and record.value is None
    assert json.loads(record.to_json_line()) == {"topic": record.topic, "key": SEED_KEY,
                                                 "value": None}


# --- value (EVT-09..14, EVT-21..23) -----------------------------------------------------

def test_value_schema_matches_seed_envelope():
    schema = codec().value_schema()
    assert schema["name"] == "PostgreSQL_server.public.customers.Envelope"
    assert schema["type"] == "struct" and schema["optional"] is False
    names = [f["field"] for f in schema["fields"]]
    assert names == ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us",
                     "ts_ns"]
    before, after, source, transaction, op, ts_ms = schema["fields"][:6]
    for image, name in ((before, "before"), (after, "after")):
        assert image == {"type": "struct", "fields": SEED_ROW_FIELDS, "optional": True,
                         "name": "PostgreSQL_server.public.customers.Value", "field": name}
    assert op == field("string", "op")
    assert ts_ms == field("int64", "ts_ms", True)
    assert transaction == {
        "type": "struct", "fields": [field("string", "id"), field("int64", "total_order"),
                                     field("int64", "data_collection_order")],
        "optional": True, "name": "event.block", "version": 1, "field": "transaction"}
    assert source["name"] == "io.debezium.connector.postgresql.Source"
    assert source["optional"] is False and source["field"] == "source"
    ours = {f["field"]: f for f in source["fields"]}
    order = [f["field"] for f in source["fields"]]
    seed_names = [f["field"] for f in SEED_SOURCE_FIELDS]
    assert [n for n in order if n in seed_names] == seed_names  # the seed's order kept
    for expected in SEED_SOURCE_FIELDS:
        if expected["field"] != "snapshot":
            assert ours[expected["field"]] == expected
    # D-05: snapshot is Debezium's string Enum, default "false"; D-06: sequence declared.
    assert ours["snapshot"] == {
        "type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
        "parameters": {"allowed": FORMATS["3.1"].snapshot_allowed}, "default": "false",
        "field": "snapshot"}
    assert ours["sequence"] == field("string", "sequence", True)
    assert ours["ts_us"] == field("int64", "ts_us", True)


def test_create_payload_matches_seed_example():
    """EVT-21 (seed 000): the create event's payload, field for field."""
    value = codec().record(row("c", after=ANNE)).value
    payload = value["payload"]
    assert list(payload) == ["before", "after", "source", "transaction", "op", "ts_ms",
                             "ts_us", "ts_ns"]
    assert payload["before"] is None and payload["after"] == ANNE
    assert payload["op"] == "c" and payload["ts_ms"] == 1559033904863
    assert payload["ts_us"] == 1559033904863000 and payload["ts_ns"] == 1559033904863000000
    expected = {**SEED_SOURCE, "snapshot": "true", "ts_us": 1559033904863000,
                "ts_ns": 1559033904863000000}
    assert payload["source"] == expected
    assert list(payload["source"]) == [f["field"] for f in value["schema"]["fields"][2]["fields"]]
    assert payload["transaction"] is None


def test_update_and_delete_payloads_match_seed_examples():
    """EVT-22/23: DEFAULT identity, so before holds the key (and NOT NULL fallbacks)."""
    anne_marie = {**ANNE, "first_name": "Anne Marie"}
    key_only = {"id": 1, "first_name": "", "last_name": "", "email": ""}
    update = codec().record(row("u", before=key_only, after=anne_marie, ts_ms=1465584025523,
                                snapshot="false", txId=556, lsn=24023128)).value["payload"]
    assert update["before"] == key_only and update["after"] == anne_marie
    assert update["op"] == "u" and update["source"]["snapshot"] == "false"
    delete = codec().record(row("d", before=key_only, ts_ms=1465581902461, snapshot="false",
                                txId=556, lsn=46523128))
    assert delete.key == SEED_KEY
    assert delete.value["payload"]["after"] is None
    assert delete.value["payload"]["before"]["id"] == 1
    assert delete.value["payload"]["source"]["lsn"] == 46523128


def test_transaction_block_only_with_transaction_metadata():
    """EVT-14, STR-69: ``provide.transaction.metadata``; numbers stay int64."""
    tx = {"id": "571:53195832", "total_order": 1, "data_collection_order": 1}
    r = row("c", after=ANNE, tx=tx)
    assert codec().record(r).value["payload"]["transaction"] is None
    with_tx = codec().record(r, transaction_metadata=True).value["payload"]["transaction"]
    assert with_tx == tx


def test_optional_flags_follow_the_converters():
    schema = codec(nullable=True).value_schema()
    assert all(f["optional"] for f in schema["fields"][1]["fields"])


def test_format_2_7_source_has_no_version_and_short_snapshot_enum():
    source = codec("2.7").value_schema()["fields"][2]
    assert "version" not in source
    snapshot = next(f for f in source["fields"] if f["field"] == "snapshot")
    assert snapshot["parameters"] == {"allowed": "true,last,false,incremental"}
    assert codec("3.1").value_schema()["fields"][2]["version"] == 1
    with pytest.raises(ConfigurationError, match=r"1\.9"):
        codec("1.9")


# --- value encodings (TYPE- items, through the converters) ----------------------------------

def encoded(pgname: str, typmod: int, value, **modes):
    oid = {"numeric": 1700, "bytea": 17, "float4": 700, "float8": 701, "hstore": 99999,
           "_int4": 1007, "timestamptz": 1184}[pgname]
    pgtype = PgType(oid, "pg_catalog", pgname, "b", "N")
    if pgname == "_int4":
        pgtype = PgType(oid, "pg_catalog", "_int4", "b", "A", element=INT4)
    rel = Relation(1, "public", "t", "d", (Column("id", 23, -1, True),
                                           Column("v", oid, typmod, False)))
    convs = [converter_for("id", INT4, -1, TypeModes()),
             converter_for("v", pgtype, typmod, TypeModes(**modes))]
    bronze = convs[1].to_bronze(pa.array([value], pa.string())).to_pylist()[0]
    r = {"key": {"id": 1}, "before": None, "after": {"id": 1, "v": bronze},
         "source": bronze_source(), "op": "c", "ts_ms": 1, "transaction": None}
    value_msg = event_to_json(r, rel, convs, "p").value
    assert value_msg is not None
    return value_msg["payload"]["after"]["v"], value_msg["schema"]["fields"][1]["fields"][1]


def test_precise_decimal_is_base64_of_unscaled_bytes():
    value, schema = encoded("numeric", ((10 << 16) | 2) + 4, "12.34")
    assert value == "BNI="  # 1234 = 0x04D2
    assert schema == {"type": "bytes", "optional": True,
                      "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
                      "parameters": {"scale": "2", "connect.decimal.precision": "10"},
                      "field": "v"}


def test_variable_scale_decimal_bytea_arrays_and_zoned_timestamp():
    value, schema = encoded("numeric", -1, "-5.5")
    assert value == {"scale": 1, "value": base64.b64encode(b"\xc9").decode()}
    assert schema["name"] == "io.debezium.data.VariableScaleDecimal"
    assert encoded("bytea", -1, "\\x00ff")[0] == "AP8="
    assert encoded("bytea", -1, "\\x00ff", binary="hex")[0] == "00ff"
    assert encoded("_int4", -1, "{1,NULL,3}")[0] == [1, None, 3]
    assert encoded("timestamptz", -1, "2018-06-20 15:13:16.945104+00")[0] == \
        "2018-06-20T15:13:16.945104Z"


def test_float_values_are_written_as_java_does():
    value, schema = encoded("float4", -1, "1.1")
    assert schema["type"] == "float" and value == 1.1  # JsonConverter's name for FLOAT32
    assert float32_value(0.1) == 0.1 and float32_value(16777217.0) == 16777216.0
    assert encoded("float8", -1, "NaN")[0] == "NaN"
    assert encoded("float8", -1, "-Infinity")[0] == "-Infinity"
    assert dumps({"a": 1e10, "b": 1.5e-4, "c": 0.5, "d": -0.0, "e": 100.0}) == \
        '{"a":1.0E10,"b":1.5E-4,"c":0.5,"d":-0.0,"e":100.0}'


def test_dumps_is_compact_utf8_in_field_order():
    text = dumps({"z": "日本語", "a": [1, None, True], "m": {"k": "\"q\""}})
    assert text == '{"z":"日本語","a":[1,null,true],"m":{"k":"\\"q\\""}}'
    assert json.loads(text) == {"z": "日本語", "a": [1, None, True], "m": {"k": "\"q\""}}
    with pytest.raises(TypeError):
        dumps({"b": b"raw"})


# --- message events (EVT-15, EVT-25, STR-60/61) ------------------------------------------------

def message_row(transactional: bool) -> dict:
    return {"source": bronze_source(schema="", table="", snapshot="false",
                                    txId=556 if transactional else None, lsn=46523128),
            "op": "m", "ts_ms": 1559033904961,
            "message": {"prefix": "foo", "content": base64.b64decode("Ymfy")},
            "transactional": transactional, "__commit_lsn": 46523128, "__ordinal": 1}


@pytest.mark.parametrize("transactional", [True, False])
def test_message_event_matches_seed_example(transactional):
    """The 3.1 layout (the seeds'); 3.6's is held against the real Debezium by
    ``tests/integration/test_debezium_differential.py`` and below."""
    record = message_to_json(message_row(transactional), PREFIX, fmt="3.1")
    assert record.topic == "PostgreSQL_server.message"
    assert record.key == {
        "schema": {"type": "struct", "fields": [field("string", "prefix", True)],
                   "optional": False, "name": "io.debezium.connector.postgresql.MessageKey",
                   "version": 1},
        "payload": {"prefix": "foo"}}
    value = record.value
    assert value["schema"]["name"] == "io.debezium.connector.postgresql.MessageValue"
    assert [f["field"] for f in value["schema"]["fields"]] == ["op", "ts_ms", "source",
                                                               "message"]
    assert value["schema"]["fields"][3] == {
        "type": "struct", "fields": [field("string", "prefix", True),
                                     field("bytes", "content", True)],
        "optional": True, "name": "io.debezium.connector.postgresql.Message", "version": 1,
        "field": "message"}
    payload = value["payload"]
    assert payload["op"] == "m" and payload["ts_ms"] == 1559033904961
    assert payload["message"] == {"prefix": "foo", "content": "Ymfy"}
    assert payload["source"]["schema"] == "" and payload["source"]["table"] == ""
    assert payload["source"]["txId"] == (556 if transactional else None)
    assert payload["source"]["snapshot"] == "false"


def test_message_value_layout_of_3_6():
    """Debezium 3.6: a ``transaction`` field (null) before a required ``message``, and the
    source's ``origin`` / ``origin_lsn``; without replace.null.with.default a streamed
    event's ``source.snapshot`` is null."""
    value = message_to_json(message_row(True), PREFIX).value
    assert [f["field"] for f in value["schema"]["fields"]] == [
        "op", "ts_ms", "source", "transaction", "message"]
    assert value["schema"]["fields"][4]["optional"] is False
    assert value["payload"]["transaction"] is None
    assert [f["field"] for f in value["schema"]["fields"][2]["fields"]][-2:] == [
        "origin", "origin_lsn"]
    assert value["payload"]["source"]["origin"] is None
    assert value["payload"]["source"]["origin_lsn"] is None
    bare = message_to_json(message_row(True), PREFIX, replace_null_with_default=False).value
    assert bare["payload"]["source"]["snapshot"] is None


def test_message_content_follows_binary_handling_mode():
    r = message_row(True)
    hexed = message_to_json(r, "p", binary_mode="hex").value
    assert hexed["payload"]["message"]["content"] == base64.b64decode("Ymfy").hex()
    assert hexed["schema"]["fields"][-1]["fields"][1] == field("string", "content", True)
    with pytest.raises(ConfigurationError, match=r"binary\.handling\.mode"):
        message_to_json(r, "p", binary_mode="raw")


def test_transaction_records():
    """STR-66/67: BEGIN and END records on ``<prefix>.transaction``."""
    end = {"status": "END", "id": "571:53195832", "event_count": 2, "ts_ms": 1486500577691,
           "data_collections": [{"data_collection": "s1.a", "event_count": 1},
                                {"data_collection": "s2.a", "event_count": 1}]}
    record = transaction_to_json(end, "dbserver1")
    assert record.topic == "dbserver1.transaction"
    assert record.key["payload"] == {"id": "571:53195832"}
    assert record.key["schema"]["name"] == "io.debezium.connector.common.TransactionMetadataKey"
    assert record.value["payload"] == end
    fields = record.value["schema"]["fields"]
    assert [f["field"] for f in fields] == ["status", "id", "event_count", "data_collections",
                                            "ts_ms"]
    assert fields[3]["items"]["name"] == "event.collection"
    begin = transaction_to_json({**end, "status": "BEGIN", "event_count": None,
                                 "data_collections": None}, "dbserver1")
    assert begin.value["payload"]["data_collections"] is None


# --- from real envelope rows ------------------------------------------------------------------

def _changes() -> TableChanges:
    seg = TableChanges(CUSTOMERS)
    rows = [
        ("c", None, (b"1", b"Anne", b"Kretchmar", b"annek@noanswer.org")),
        ("u", None, (b"1", b"Anne Marie", b"Kretchmar", UNCHANGED_TOAST)),
        ("d", (b"1", None, None, None), None),
        ("t", None, None),
    ]
    for i, (op, before, after) in enumerate(rows):
        seg.op.append(op)
        seg.before.append(before)
        seg.before_key_only.append(before is not None)
        seg.after.append(after)
        seg.commit_lsn.append(100 + i)
        seg.lsn.append(90 + i)
        seg.xid.append(556)
        seg.commit_ts_us.append(1559033904863123)
        seg.total_order.append(i + 1)
        seg.collection_order.append(i + 1)
        seg.truncate_options.append(0)
    return seg


def test_envelope_rows_round_trip_through_the_export():
    convs = customers_converters()
    table = bronze_from_changes(_changes(), convs, SourceIdentity(PREFIX, "postgres"), 42,
                                tombstones=True)
    rows = table.to_pylist()
    c = table_codec(CUSTOMERS, convs, PREFIX)
    records = [c.record(r, transaction_metadata=True) for r in rows]
    ops = [r.value["payload"]["op"] if r.value else None for r in records]
    assert ops == ["c", "u", "d", None, "t"]
    create, update, delete, tomb, truncate = records
    assert create.key == SEED_KEY and create.value["payload"]["after"] == ANNE
    # an unchanged TOAST column carries the placeholder (TYPE-17)
    assert update.value["payload"]["after"]["email"] == "__debezium_unavailable_value"
    assert delete.value["payload"]["before"] == {"id": 1, "first_name": "", "last_name": "",
                                                 "email": ""}
    assert tomb.key == SEED_KEY and tomb.value is None
    assert truncate.key is None
    src = create.value["payload"]["source"]
    assert src["ts_ms"] == 1559033904863 and src["ts_us"] == 1559033904863123
    assert src["ts_ns"] == 1559033904863123000 and src["sequence"] == '["100","90"]'
    assert create.value["payload"]["transaction"] == {"id": "556:100", "total_order": 1,
                                                      "data_collection_order": 1}
    assert create.value["payload"]["ts_ms"] == 42
    # every message is valid JSON whose text parses back to the same structure
    for record in records:
        assert json.loads(record.to_json_line())["value"] == record.value


def test_codec_from_bronze_metadata_equals_codec_from_converters():
    convs = customers_converters()
    from_convs = table_codec(CUSTOMERS, convs, PREFIX)
    from_meta = table_codec_from_bronze(bronze_schema(CUSTOMERS, convs), PREFIX, "public",
                                        "customers")
    assert from_meta.key_schema() == from_convs.key_schema()
    assert from_meta.value_schema() == from_convs.value_schema()
    r = row("c", after=ANNE)
    assert from_meta.record(r) == from_convs.record(r)
    with pytest.raises(ConfigurationError, match=r"debezium\.schema"):
        table_codec_from_bronze(pa.schema([pa.field("key", pa.struct([])),
                                           pa.field("after", pa.struct([("v", pa.int32())]))]),
                                PREFIX, "public", "t")


def test_key_fields_do_not_carry_propagated_source_types():
    """Debezium builds key fields without column mappers (EVT-06, TYPE-15)."""
    options = ColumnOptions.parse([("column.propagate.source.type", r"public\.customers\..*")])
    rel, convs = options.shape(CUSTOMERS, customers_converters(), TYPES)
    c = table_codec(rel, convs, PREFIX)
    assert c.key_schema() == SEED_KEY["schema"]
    value_id = c.value_schema()["fields"][1]["fields"][0]
    assert value_id["parameters"] == {"__debezium.source.column.type": "INT4",
                                      "__debezium.source.column.length": "10",
                                      "__debezium.source.column.scale": "0"}


def test_schema_from_json_round_trips():
    for conv in customers_converters():
        schema = conv.connect_schema()
        assert schema_from_json(schema).json_schema(field=schema["field"]) == schema


def test_names_topics_and_adjustment():
    """EVT-27 topic names; EVT-30 Avro name adjustment (schema.name.adjustment.mode)."""
    assert topic_name("pgcdc", "public", "Mixed Case") == "pgcdc.public.Mixed_Case"
    assert adjust_schema_name("pgcdc.public.Mixed Case") == "pgcdc.public.Mixed Case"
    assert adjust_schema_name("1pg-cdc.public.Mixed Case", "avro") == "_pg_cdc.public.Mixed_Case"
    with pytest.raises(ConfigurationError, match="adjustment"):
        adjust_schema_name("x", "bogus")
    rel = Relation(1, "public", "Mixed Case", "d", (Column("Key", 23, -1, True),))
    c = table_codec(rel, [converter_for("Key", INT4, -1, TypeModes(), nullable=False)], "pgcdc",
                    schema_name_adjustment="avro")
    assert c.topic == "pgcdc.public.Mixed_Case"
    assert c.key_schema()["name"] == "pgcdc.public.Mixed_Case.Key"


def test_record_is_plain_data():
    r = DebeziumRecord("t", None, None)
    assert json.loads(r.to_json_line()) == {"topic": "t", "key": None, "value": None}
    text = TEXT  # text columns encode as plain strings
    conv = converter_for("v", text, -1, TypeModes())
    assert conv.to_json("x") == "x"


def test_versioned_fields_export_under_the_column_name():
    """After a type change (docs/types.md "Schema changes") a column's values live in
    ``<column>__v<n>``; the export writes them under the column with the schema of their
    time (schema-history shape), or the newest schema when no history exists."""
    from pgcdc_dagster.cdc.column_versions import renamed
    from pgcdc_dagster.cdc.debezium_json import table_codec_from_bronze, table_codec_of_shape
    from pgcdc_dagster.lake.schema_history import Shape

    def c(name: str, column: str):
        return converter_for(column, PgType(0, "pg_catalog", name, "b", "U"), -1, TypeModes())

    rel = Relation(1, "public", "t", "d", (Column("id", 23, -1, True),
                                           Column("n", 20, -1, False)))
    old = (c("int4", "id"), c("int4", "n"))
    new = (old[0], renamed(c("int8", "n"), "n__v2"))
    row = {"key": {"id": 1}, "before": None, "after": {"id": 1, "n": None, "n__v2": 2**40},
           "source": {"version": "v", "connector": "postgresql", "name": "p", "ts_ms": 1,
                      "snapshot": "false", "db": "d", "schema": "public", "table": "t"},
           "op": "c", "ts_ms": 1}
    codec = table_codec_of_shape(Shape.of(rel, new).parsed(), "p", "public", "t")
    value = codec.record(row).value
    assert value["payload"]["after"] == {"id": 1, "n": 2**40}
    assert value["schema"]["fields"][1]["fields"][1] == {"type": "int64", "optional": True,
                                                         "field": "n"}
    old_codec = table_codec_of_shape(Shape.of(rel, old).parsed(), "p", "public", "t")
    old_row = {**row, "after": {"id": 1, "n": 7, "n__v2": None}}
    assert old_codec.record(old_row).value["payload"]["after"] == {"id": 1, "n": 7}
    # without a history: one field per column, its newest version
    after = pa.struct([old[0].bronze_field, old[1].bronze_field, new[1].bronze_field])
    schema = pa.schema([pa.field("key", pa.struct([old[0].bronze_field])),
                        pa.field("after", after)])
    fallback = table_codec_from_bronze(schema, "p", "public", "t")
    assert [(f.name, f.stored) for f in fallback.value_fields] == [("id", "id"),
                                                                  ("n", "n__v2")]
    assert fallback.record(row).value["payload"]["after"] == {"id": 1, "n": 2**40}
