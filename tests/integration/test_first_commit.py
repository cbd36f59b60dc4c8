"""A new local table's first commit, written without delta-rs's create
(``lake/first_commit.py``), is the commit delta-rs's create writes.

Every table a snapshot creates on local storage gets the hand-written version 0. For the
tables real snapshots create (every type the type mapping produces, in both sets of type
modes, hostile column names, an empty table) and for synthetic schemas (nested structs, lists
and maps, decimals, ``timestamp_ntz`` at the top, in a struct and in a list), a twin table is
created by delta-rs's own create with the same schema, files, app transactions and commit
metadata: the parsed actions are equal but for ids, timestamps and the location (the protocol
and table features included: reader 3 / writer 7 with ``timestampNtz`` where delta-rs sets
it), and delta-rs reads both back with the same version, protocol, schema, rows, app
transactions, history and file statistics; Spark reads the files the hand-written log lists
with the rows delta-rs reads. Schemas whose protocol the module does not decide
(``timestamp_ntz`` only in a map, Delta's own column metadata) are left to delta-rs (which
fails on the first: it writes the commit but cannot load it back). A table
that exists, whose log was cleaned up to a checkpoint, or that several writers create at once
is never created twice.

(Spark reads the Parquet files, not the Delta log: this project has no Delta jars for Spark,
``/work/shared/reference/environment.md``; its Spark reads tables through the files delta-rs
lists, as here.)
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, create_table_with_add_actions
from psycopg2 import sql

from pgcdc_dagster.capture.runner import run_bronze
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.typeconv import TypeModes
from pgcdc_dagster.lake.delta import commit_properties, create_with_files, write_part
from pgcdc_dagster.lake.first_commit import first_protocol, location_url
from pgcdc_dagster.lake.paths import table_uri
from tests.integration.test_types_delta import COLUMNS
from tests.support.delta_log import commit_actions

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TWINS = "twins é{}`<> \"$&+,;=@!()*'~"
"""Where the twins go: a path delta-rs percent-encodes in places (not ``#`` or ``?``, with
which its history comes back empty)."""
HOSTILE = ["it's", 'say "hi"', "back`tick", " spaced name ", "a + b", "t.id", "Ünïcødé 名前"]
NTZ = {"minReaderVersion": 3, "minWriterVersion": 7,
       "readerFeatures": ["timestampNtz"], "writerFeatures": ["timestampNtz"]}
PLAIN = {"minReaderVersion": 1, "minWriterVersion": 2}
_STANDARD_INFO = {"timestamp", "operation", "operationParameters", "engineInfo",
                  "clientVersion"}


def _normalised(uri: str) -> list[dict[str, Any]]:
    """Version 0's actions without what differs between two creations (ids, times, the
    table's location), their JSON strings parsed."""
    out = []
    for action in commit_actions(uri, 0):
        for kind, body in action.items():
            if kind == "commitInfo":
                body.pop("timestamp")
                params = body["operationParameters"]
                params.pop("location")
                params["protocol"] = json.loads(params["protocol"])
                params["metadata"] = _metadata(json.loads(params["metadata"]))
            elif kind == "metaData":
                _metadata(body)
            elif kind == "add":
                body.pop("modificationTime")
        out.append(action)
    return out


def _metadata(body: dict[str, Any]) -> dict[str, Any]:
    body.pop("id")
    body.pop("createdTime")
    body["schemaString"] = json.loads(body["schemaString"])
    return body


def _twin(hand: str, twin: str) -> None:
    """Create ``twin`` with delta-rs's create, from what the hand-written version 0 holds
    (its schema, files, app transactions and commit metadata): the files are copied."""
    actions = commit_actions(hand, 0)
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    meta = next(a["metaData"] for a in actions if "metaData" in a)
    adds = [a["add"] for a in actions if "add" in a]
    os.makedirs(twin)
    for add in adds:
        target = os.path.join(twin, unquote(add["path"]))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy(os.path.join(hand, unquote(add["path"])), target)
    props = CommitProperties(
        custom_metadata={k: v for k, v in info.items() if k not in _STANDARD_INFO},
        app_transactions=[Transaction(a["txn"]["appId"], a["txn"]["version"])
                          for a in actions if "txn" in a])
    create_table_with_add_actions(
        twin, DeltaSchema.from_json(meta["schemaString"]),
        [AddAction(a["path"], a["size"], {}, a["modificationTime"], True, a["stats"])
         for a in adds], mode="error", commit_properties=props)


def _same_table(hand: str, twin: str, spark: Any, protocol: dict[str, Any] | None) -> int:
    """``hand`` (hand-written) and ``twin`` (delta-rs) hold the same commit and read back
    the same; ``protocol``: the one expected (None: left to delta-rs). Returns the rows."""
    assert _normalised(hand) == _normalised(twin), hand
    location = commit_actions(twin, 0)[0]["commitInfo"]["operationParameters"]["location"]
    assert location == location_url(twin)  # as delta-rs spells a path as a URL
    logged = next(a["protocol"] for a in commit_actions(hand, 0) if "protocol" in a)
    if protocol is not None:
        assert logged == protocol, hand
    a, b = DeltaTable(hand), DeltaTable(twin)
    assert a.version() == b.version() == 0
    assert a.protocol() == b.protocol()
    assert json.loads(a.schema().to_json()) == json.loads(b.schema().to_json())
    rows = a.to_pyarrow_table()
    assert rows.equals(b.to_pyarrow_table()), hand
    for txn in (x["txn"] for x in commit_actions(hand, 0) if "txn" in x):
        assert a.transaction_version(txn["appId"]) == b.transaction_version(txn["appId"]) \
            == txn["version"]
    history = [{k: v for k, v in t.history()[0].items()
                if k not in ("timestamp", "operationParameters")} for t in (a, b)]
    assert history[0] == history[1]
    stats = [pa.table(t.get_add_actions(flatten=True)).drop(["modification_time"])
             for t in (a, b)]
    assert stats[0].equals(stats[1]), hand
    files = [unquote(u) for u in a.file_uris()]
    if files:  # Spark reads what the hand-written log lists, as the project's Spark does
        frame = spark.read.parquet(*files)
        assert frame.count() == rows.num_rows
        if "id" in rows.column_names:
            assert sorted(r[0] for r in frame.select("id").collect()) == \
                sorted(rows.column("id").to_pylist())
    return rows.num_rows


def _capture(pg_dsn: str, lakehouse: Path, name: str, modes: TypeModes) -> CaptureSettings:
    return CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\..*",),
                           slot=name, publication=name, modes=modes)


def test_snapshot_tables_get_the_commit_delta_rs_would_write(pg_dsn, pg_conn, spark,
                                                              tmp_path) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS hstore")
        cur.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
        cols = sql.SQL(", ").join(
            [sql.SQL("{} " + ddl).format(sql.Identifier(n)) for n, (ddl, _) in COLUMNS.items()]
            + [sql.SQL("{} text").format(sql.Identifier(n)) for n in HOSTILE])
        cur.execute(sql.SQL("CREATE TABLE every (id int PRIMARY KEY, {})").format(cols))
        cur.execute(sql.SQL("INSERT INTO every (id, {}) VALUES (1, {})").format(
            sql.SQL(", ").join(sql.Identifier(n) for n in COLUMNS),
            sql.SQL(", ".join(lit for _, lit in COLUMNS.values()))))
        cur.execute(sql.SQL("INSERT INTO every (id, {}) VALUES (2, 'x')").format(
            sql.Identifier(HOSTILE[1])))
        cur.execute("CREATE TABLE empty (id bigint PRIMARY KEY, at timestamp)")
    modes = {"plain": TypeModes(), "other": TypeModes(
        time_precision="connect", decimal="string", interval="string", binary="base64",
        hstore="map")}
    created = []
    for name, mode in modes.items():
        lakehouse = tmp_path / name
        run_bronze(_capture(pg_dsn, lakehouse, f"first_{name}", mode), spark,
                   force_snapshot_step=True)
        for layer in ("bronze", "silver"):
            for table in ("every", "empty"):
                hand = table_uri(str(lakehouse), layer, "public", table)
                _twin(hand, str(tmp_path / TWINS / name / layer / table))
                rows = _same_table(hand, str(tmp_path / TWINS / name / layer / table),
                                   spark, None)
                assert rows == (2 if table == "every" else 0)
                created.append(next(a["protocol"] for a in commit_actions(hand, 0)
                                    if "protocol" in a))
    # silver keeps PostgreSQL's timestamp as timestamp_ntz: those tables need the feature
    assert NTZ in created and PLAIN in created


SYNTHETIC: dict[str, tuple[pa.Schema, list[dict[str, Any]], dict[str, Any] | None]] = {
    "nested": (pa.schema([
        pa.field("id", pa.int64(), nullable=False, metadata={"pg.type": "bigint"}),
        pa.field("s", pa.struct([
            pa.field("at", pa.timestamp("us")), pa.field("d", pa.decimal128(38, 18)),
            pa.field("l", pa.list_(pa.struct([
                pa.field("x", pa.int32()),
                pa.field("m", pa.map_(pa.string(), pa.list_(pa.int64())))])))])),
        pa.field("ats", pa.list_(pa.timestamp("us")))]),
        [{"id": 1, "s": {"at": None, "d": Decimal("12345678901234567890.123456789012345678"),
                         "l": [{"x": 1, "m": [("k", [1, 2])]}]}, "ats": [None]},
         {"id": 2, "s": None, "ats": None}], NTZ),
    "ntz_in_struct": (pa.schema([pa.field("id", pa.int64()), pa.field(
        "s", pa.struct([pa.field("at", pa.timestamp("us"))]))]),
        [{"id": 1, "s": {"at": None}}], NTZ),
    "ntz_in_list": (pa.schema([pa.field("id", pa.int64()),
                               pa.field("l", pa.list_(pa.timestamp("us")))]),
                    [{"id": 1, "l": []}], NTZ),
    "hostile": (pa.schema([pa.field("id", pa.int64())] + [
        pa.field(n, pa.decimal128(5, 2) if i % 2 else pa.string()) for i, n in
        enumerate(HOSTILE)] + [pa.field("tz", pa.timestamp("us", tz="UTC")),
                               pa.field("raw", pa.binary()), pa.field("day", pa.date32())]),
        [{"id": 1, HOSTILE[1]: Decimal("1.25")}], PLAIN),
    "ntz_in_map": (pa.schema([pa.field("id", pa.int64()), pa.field(
        "m", pa.map_(pa.string(), pa.timestamp("us")))]), [{"id": 1, "m": []}], None),
    "invariant": (pa.schema([pa.field("id", pa.int64(), metadata={
        "delta.invariants": json.dumps({"expression": {"expression": "id > 0"}})})]),
        [{"id": 1}], None),
}


@pytest.mark.parametrize("name", list(SYNTHETIC))
def test_schemas_get_the_protocol_delta_rs_gives_them(name: str, spark, tmp_path) -> None:
    schema, rows, protocol = SYNTHETIC[name]
    assert first_protocol(DeltaSchema.from_arrow(schema).to_json()) == protocol
    hand = str(tmp_path / "hand")
    os.makedirs(hand)
    data = pa.Table.from_pylist(rows, schema=schema)
    files = [write_part(hand, data), write_part(hand, data.slice(0, 1))]
    props = commit_properties("p:snapshot:t", 7, {"pgcdc.kind": "snapshot", "pgcdc.rows": "3"})
    if name == "ntz_in_map":  # left to delta-rs, which cannot read such a table back
        with pytest.raises(DeltaError, match="TIMESTAMP_NTZ"):
            create_with_files(hand, schema, files, properties=props)
        return
    assert create_with_files(hand, schema, files, properties=props) is None
    _twin(hand, str(tmp_path / TWINS))
    assert _same_table(hand, str(tmp_path / TWINS), spark, protocol) == \
        data.num_rows + 1


def test_a_table_is_never_created_twice(tmp_path) -> None:
    schema = pa.schema([pa.field("id", pa.int64())])
    props = commit_properties("p", 1)
    # a table there already: returned, its log untouched
    uri = str(tmp_path / "t")
    assert create_with_files(uri, schema, [], properties=props) is None
    first = Path(uri, "_delta_log", f"{0:020d}.json").read_bytes()
    again = create_with_files(uri, schema, [write_part(uri, pa.table({"id": [1]}))],
                              properties=props)
    assert again is not None and again.version() == 0
    assert Path(uri, "_delta_log", f"{0:020d}.json").read_bytes() == first
    # a log cleaned up to a checkpoint (version 0's file gone): no new version 0
    cleaned = str(tmp_path / "cleaned")
    for n in range(3):
        write_deltalake(cleaned, pa.table({"id": [n]}), mode="append")
    DeltaTable(cleaned).create_checkpoint()
    for n in range(2):
        os.unlink(os.path.join(cleaned, "_delta_log", f"{n:020d}.json"))
    found = create_with_files(cleaned, schema, [], properties=props)
    assert found is not None and found.version() == 2
    assert not os.path.exists(os.path.join(cleaned, "_delta_log", f"{0:020d}.json"))
    # a temporary file a crashed writer left is no table: the table is created
    stale = str(tmp_path / "stale")
    os.makedirs(os.path.join(stale, "_delta_log"))
    Path(stale, "_delta_log", "_commit_0.json.tmp").write_text("{}")
    assert create_with_files(stale, schema, [], properties=props) is None
    # writers racing to create one table: exactly one creates it, the others get it
    raced = str(tmp_path / "raced")
    outcomes: list[object] = []
    start = threading.Barrier(6)

    def create(n: int) -> None:
        start.wait()
        got = create_with_files(raced, schema, [], properties=commit_properties("p", n))
        outcomes.append(got)

    threads = [threading.Thread(target=create, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(o is None for o in outcomes) == 1 and len(outcomes) == 6
    table = DeltaTable(raced)
    assert table.version() == 0 and table.transaction_version("p") in range(6)
    assert sorted(os.listdir(os.path.join(raced, "_delta_log"))) == [f"{0:020d}.json"]
