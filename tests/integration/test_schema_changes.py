"""Schema changes in the middle of a stream (STR- schema
items): columns added, dropped and renamed between and inside windows lose no event, old
bronze rows keep their values, silver follows the source; a column's type change goes to a
versioned bronze field (docs/types.md, "Schema changes"); a key's type change is refused."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import apply_silver_tables, run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.capture.stream import run_windows
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.export import export_table
from pgcdc_dagster.lake.evolution import SchemaChangeError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.schema_history import history_uri, read_history
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_add_drop_rename_columns_mid_stream(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE s (id int PRIMARY KEY, a text, b int)")
        cur.execute("INSERT INTO s SELECT g, 'a' || g, g FROM generate_series(1, 20) g")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.s",),
                               slot="evo", publication="evo")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        # all in one window: old shape, add column, new shape, drop, rename
        cur.execute("UPDATE s SET b = b + 100 WHERE id <= 5")
        cur.execute("ALTER TABLE s ADD COLUMN c numeric(6,2)")
        cur.execute("UPDATE s SET c = id * 1.5 WHERE id <= 10")
        cur.execute("INSERT INTO s VALUES (21, 'new', 21, 2.25)")
        cur.execute("ALTER TABLE s DROP COLUMN b")
        cur.execute("UPDATE s SET a = 'after drop' WHERE id = 1")
        cur.execute("ALTER TABLE s RENAME COLUMN a TO title")
        cur.execute("UPDATE s SET title = 'renamed' WHERE id = 2")
        cur.execute("DELETE FROM s WHERE id = 3")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    bronze = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "s")).to_pyarrow_table()
    ops = pc.value_counts(bronze["op"]).to_pylist()
    assert {o["values"]: o["counts"] for o in ops} == {"r": 20, "u": 5 + 10 + 1 + 1, "c": 1,
                                                       "d": 1}
    after_fields = {f.name for f in bronze.schema.field("after").type}
    assert {"id", "a", "b", "c", "title"} <= after_fields
    first = bronze.filter(pc.and_(pc.equal(bronze["op"], "u"),
                                  pc.equal(bronze["__commit_lsn"],
                                           pc.min(bronze["__commit_lsn"])))).to_pylist()
    assert all(r["after"]["b"] > 100 and r["after"]["c"] is None for r in first)
    snap = bronze.filter(pc.equal(bronze["op"], "r")).to_pylist()
    assert all(r["after"]["b"] == r["after"]["id"] for r in snap)  # history kept its values
    # A rename reaches silver as a new column (documented limitation): rows changed after the
    # rename carry it; the old column keeps the values it had.
    silver = {r["id"]: r for r in DeltaTable(
        table_uri(str(lakehouse), "silver", "public", "s")).to_pyarrow_table().to_pylist()}
    assert silver[2]["title"] == "renamed"
    assert silver[11]["a"] == "a11" and silver[11]["title"] is None
    assert silver[3]["__deleted"] and silver[21]["c"] is not None
    # The export gives each event the columns of its time (schema history keyed by LSN).
    shapes = [[f["field"] for f in r.value["schema"]["fields"][1]["fields"]]
              for r in export_table(str(lakehouse), "public", "s")]
    assert shapes[0] == ["id", "a", "b"] and shapes[20] == ["id", "a", "b"]  # r, first u
    assert ["id", "a", "b", "c"] in shapes and ["id", "a", "c"] in shapes
    assert shapes[-1] == ["id", "title", "c"]
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE s SET title = title")  # touch every row: silver converges
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "s"),
                                "public", "s", ["id"])


def _bronze(lakehouse) -> pa.Table:
    return DeltaTable(table_uri(str(lakehouse), "bronze", "public", "s")).to_pyarrow_table()


def test_type_changes_mid_stream_keep_history(pg_dsn, pg_conn, spark, lakehouse) -> None:
    """ALTER COLUMN ... TYPE between changes of one window (TYPE-01/02/04
    encodings): int -> bigint, int -> text and numeric(10,2) -> numeric(12,4) each move the
    column's new values to a versioned bronze field; old events keep theirs; no event is
    lost; silver (rewritten to the new types) equals the source; the schema history keyed
    by LSN gives the export each event's schema of its time."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE s (id int PRIMARY KEY, a int, b int, c numeric(10,2), "
                    "v varchar(10))")
        cur.execute("INSERT INTO s SELECT g, g, -g, g * 1.25, 'v' || g "
                    "FROM generate_series(1, 20) g")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.s",),
                               slot="evo2", publication="evo2", topic_prefix="srv")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE s SET a = a + 100 WHERE id <= 3")  # before the changes
        cur.execute("ALTER TABLE s ALTER COLUMN a TYPE bigint")
        cur.execute("UPDATE s SET a = 5000000000 + id WHERE id IN (4, 5)")
        cur.execute("ALTER TABLE s ALTER COLUMN b TYPE text")
        cur.execute("ALTER TABLE s ALTER COLUMN c TYPE numeric(12,4)")
        cur.execute("ALTER TABLE s ALTER COLUMN v TYPE varchar(30)")  # compatible: in place
        cur.execute("INSERT INTO s VALUES (21, 9000000000, 'zwölf', 12345678.1234, "
                    "'a longer value than ten')")
        cur.execute("UPDATE s SET b = b || '!', c = c + 0.0001 WHERE id IN (6, 7)")
        cur.execute("DELETE FROM s WHERE id = 8")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    bronze = _bronze(lakehouse)
    ops = {o["values"]: o["counts"] for o in pc.value_counts(bronze["op"]).to_pylist()}
    assert ops == {"r": 20, "u": 3 + 2 + 2, "c": 1, "d": 1}  # no event lost
    after = bronze.schema.field("after").type
    names = [after.field(i).name for i in range(after.num_fields)]
    assert names == ["id", "a", "b", "c", "v", "a__v2", "b__v2", "c__v2"]
    assert after.field("a").type == pa.int32() and after.field("a__v2").type == pa.int64()
    assert after.field("b__v2").type == pa.string()
    assert after.field("a__v2").metadata[b"pgcdc.column"] == b"a"
    scale = json.loads(after.field("c__v2").metadata[b"debezium.parameters"])["scale"]
    assert scale == "4"
    rows = sorted(bronze.to_pylist(), key=lambda r: (r["__commit_lsn"], r["__ordinal"]))
    snap = [r["after"] for r in rows if r["op"] == "r"]
    # history kept its values and encodings: a int32, c the unscaled bytes of scale 2
    assert all(r["a"] == r["id"] and r["a__v2"] is None for r in snap)
    assert snap[0]["c"] == (125).to_bytes(1, "big") and snap[0]["c__v2"] is None
    stream = [r for r in rows if r["op"] != "r"]
    first = [r["after"] for r in stream[:3]]
    assert [(r["a"], r["a__v2"]) for r in first] == [(101, None), (102, None), (103, None)]
    later = [r["after"] for r in stream[3:] if r["after"] is not None]
    assert all(r["a"] is None for r in later)  # after a's change: its new field only
    assert [(r["b"], r["b__v2"]) for r in later[:2]] == [(-4, None), (-5, None)]
    assert all(r["b"] is None and r["c"] is None for r in later[2:])
    assert [r["a__v2"] for r in later[:2]] == [5000000004, 5000000005]
    created = next(r["after"] for r in stream if r["op"] == "c")
    assert created["b__v2"] == "zwölf" and created["v"] == "a longer value than ten"
    assert int.from_bytes(created["c__v2"], "big", signed=True) == 123456781234
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "s"),
                                "public", "s", ["id"])
    silver = DeltaTable(table_uri(str(lakehouse), "silver", "public", "s"))
    types = {f.name: f.type for f in pa.schema(silver.schema().to_arrow())}
    assert (types["a"], types["b"], types["c"]) == (pa.int64(), pa.string(),
                                                   pa.decimal128(12, 4))

    # A later run reuses the versioned fields; silver keeps converging.
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE s SET a = a * 2, b = 'x', c = 1.5 WHERE id IN (1, 9)")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    after = _bronze(lakehouse).schema.field("after").type
    assert after.num_fields == 8
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "s"),
                                "public", "s", ["id"])
    # An unchanged out-of-line value of a versioned column (TYPE-17) keeps silver's value.
    with pg_conn.cursor() as cur:
        cur.execute("ALTER TABLE s ALTER COLUMN b SET STORAGE EXTERNAL")
        cur.execute("UPDATE s SET b = repeat('long ', 2000) WHERE id = 10")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE s SET a = 1 WHERE id = 10")
    run_bronze(settings, spark, force_snapshot_step=False)
    last = _bronze(lakehouse).to_pylist()
    assert max(last, key=lambda r: r["__commit_lsn"])["__toast_unchanged"] == ["b__v2"]
    run_silver(settings, spark)
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "s"),
                                "public", "s", ["id"])

    # The export gives each event the schema of its time, under the column's own name.
    records = list(export_table(str(lakehouse), "public", "s"))
    assert len(records) == bronze.num_rows + 4
    fields = [{f["field"]: f for f in r.value["schema"]["fields"][1]["fields"]}
              for r in records]
    payloads = [r.value["payload"]["after"] for r in records]
    assert list(fields[0]) == ["id", "a", "b", "c", "v"]
    assert fields[0]["a"]["type"] == "int32" and fields[20]["a"]["type"] == "int32"
    assert payloads[20]["a"] == 101
    i = next(i for i, r in enumerate(records)
             if r.value["payload"]["op"] == "u" and payloads[i]["id"] == 4)
    assert fields[i]["a"]["type"] == "int64" and payloads[i]["a"] == 5000000004
    j = next(i for i, r in enumerate(records) if r.value["payload"]["op"] == "c")
    assert fields[j]["b"]["type"] == "string" and payloads[j]["b"] == "zwölf"
    assert fields[j]["c"]["parameters"]["scale"] == "4"
    assert set(payloads[j]) == {"id", "a", "b", "c", "v"}
    history = read_history(history_uri(str(lakehouse)), "public", "s")
    assert len(history) >= 2 and (history[0].lsn, history[0].ordinal) == (0, 0)


def test_rename_then_retype_in_one_window(pg_dsn, pg_conn, spark, lakehouse) -> None:
    """A column renamed and then retyped inside one window (QA, STR- schema items): the run's
    contexts are built from the catalog (b bigint, in the plain field ``b``), the window's
    events before the ALTER TYPE land in ``b__v2`` (int). Silver, applied with the run's
    contexts as the capture job does, reads both fields; rebuilt from bronze with fresh
    contexts, it casts each version straight to bigint (b's int32 "newer" version by number
    cannot hold 5000000003)."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE s (id int PRIMARY KEY, a int)")
        cur.execute("INSERT INTO s SELECT g, g FROM generate_series(1, 5) g")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.s",),
                               slot="evo6", publication="evo6")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("ALTER TABLE s RENAME COLUMN a TO b")
        cur.execute("UPDATE s SET b = -2 WHERE id = 2")
        cur.execute("ALTER TABLE s ALTER COLUMN b TYPE bigint")
        cur.execute("UPDATE s SET b = 5000000003 WHERE id = 3")
    run = run_bronze(settings, spark, force_snapshot_step=False)
    apply_silver_tables(run.contexts, spark, settings.silver_spark_threshold_rows)
    uri = table_uri(str(lakehouse), "silver", "public", "s")
    expected = {2: -2, 3: 5000000003}

    def changed() -> dict[int, int]:
        rows = DeltaTable(uri).to_pyarrow_table(columns=["id", "b"]).to_pylist()
        return {r["id"]: r["b"] for r in rows if r["id"] in expected}

    assert changed() == expected  # id 2's value was lost (null in silver)
    shutil.rmtree(uri)  # silver rebuilt from the whole of bronze
    run_silver(settings, spark)  # raised ArrowInvalid: 5000000003 not in int32's range
    assert changed() == expected


def test_key_type_change_is_refused_with_the_fix(pg_dsn, pg_conn, spark, lakehouse) -> None:
    """A key column's type change cannot be followed (bronze keys, the silver MERGE key):
    refused before anything is written, and the slot keeps the changes."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE s (id int PRIMARY KEY, n int)")
        cur.execute("INSERT INTO s VALUES (1, 1)")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.s",),
                               slot="evo3", publication="evo3")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("ALTER TABLE s ALTER COLUMN id TYPE bigint")
        cur.execute("UPDATE s SET n = 2")
    with pytest.raises(SchemaChangeError, match=r"key column id.*snapshot it again"):
        run_bronze(settings, spark, force_snapshot_step=False)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT confirmed_flush_lsn < pg_current_wal_lsn() FROM pg_replication_slots "
                    "WHERE slot_name = 'evo3'")
        assert cur.fetchone()[0]  # nothing was skipped: the slot did not move past it


def test_type_change_after_the_contexts_were_built(pg_dsn, pg_conn, spark, lakehouse) -> None:
    """The stream meets a type change its table contexts do not know (they were built before
    the ALTER, as in a long run): the new values still go to a versioned field."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE s (id int PRIMARY KEY, a int, note text)")
        cur.execute("INSERT INTO s SELECT g, g, 'n' || g FROM generate_series(1, 5) g")
        cur.execute("SELECT current_database()")
        db = cur.fetchone()[0]
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.s",),
                               slot="evo4", publication="evo4")
    run_bronze(settings, spark, force_snapshot_step=True)
    contexts = load_contexts(settings)  # built for a int
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE s SET a = -1 WHERE id = 1")
        cur.execute("ALTER TABLE s ALTER COLUMN a TYPE numeric(6,1)")
        cur.execute("UPDATE s SET a = 2.5 WHERE id = 2")
        cur.execute("ALTER TABLE s ALTER COLUMN a TYPE text")
        cur.execute("UPDATE s SET a = 'drei' WHERE id = 3")
    run_windows(settings, contexts, SourceIdentity(settings.topic_prefix, db))
    run_silver(settings, spark)
    after = _bronze(lakehouse).schema.field("after").type
    assert [after.field(i).name for i in range(after.num_fields)] == [
        "id", "a", "note", "a__v2", "a__v3"]
    updates = sorted((r["__commit_lsn"], r["after"]) for r in _bronze(lakehouse).to_pylist()
                     if r["op"] == "u")
    assert [(u["a"], u["a__v2"], u["a__v3"]) for _, u in updates] == [
        (-1, None, None), (None, (25).to_bytes(1, "big"), None), (None, None, "drei")]
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "s"),
                                "public", "s", ["id"])


def test_versioned_fields_and_real_columns_named_like_them(pg_dsn, pg_conn, spark,
                                                           lakehouse) -> None:
    """A source column really named ``a__v2`` (and ``B__V2`` differing in case) next to
    ``a``'s and ``b``'s type changes, then a column added under the name of a versioned
    field: every field name stays distinct (Delta would refuse the write, or
    mix the two columns' values), and silver equals the source."""
    with pg_conn.cursor() as cur:
        cur.execute('CREATE TABLE s (id int PRIMARY KEY, a int, a__v2 text, b int, '
                    '"B__V2" text)')
        cur.execute("INSERT INTO s SELECT g, g, 'r' || g, -g, 'R' || g "
                    "FROM generate_series(1, 10) g")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=("public\\.s",),
                               slot="evo_names", publication="evo_names")
    run_bronze(settings, spark, force_snapshot_step=True)
    with pg_conn.cursor() as cur:
        cur.execute("ALTER TABLE s ALTER COLUMN a TYPE bigint")
        cur.execute("ALTER TABLE s ALTER COLUMN b TYPE text")
        cur.execute("UPDATE s SET a = 5000000000 + id, a__v2 = 'u' || id, b = 'b' || id "
                    "WHERE id <= 4")
        cur.execute("INSERT INTO s VALUES (11, 7000000000, 'new', 'nb', 'NB')")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    after = _bronze(lakehouse).schema.field("after").type
    fields = {after.field(i).name: after.field(i) for i in range(after.num_fields)}
    assert list(fields) == ["id", "a", "a__v2", "b", "B__V2", "a__v3", "b__v3"]
    assert fields["a__v3"].metadata[b"pgcdc.column"] == b"a"
    assert fields["a__v3"].type == pa.int64() and fields["a__v2"].type == pa.string()
    assert b"pgcdc.column" not in (fields["a__v2"].metadata or {})
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "s"),
                                "public", "s", ["id"])

    # c changes type (c__v2 is c's), then a column c__v2 is added: it gets its own field
    with pg_conn.cursor() as cur:
        cur.execute("ALTER TABLE s ADD COLUMN c int")
        cur.execute("UPDATE s SET c = id")
    run_bronze(settings, spark, force_snapshot_step=False)
    with pg_conn.cursor() as cur:
        cur.execute("ALTER TABLE s ALTER COLUMN c TYPE text")
        cur.execute("UPDATE s SET c = 'c' || id WHERE id <= 2")
    run_bronze(settings, spark, force_snapshot_step=False)
    with pg_conn.cursor() as cur:
        cur.execute("ALTER TABLE s ADD COLUMN c__v2 numeric(6,1)")
        cur.execute("UPDATE s SET c__v2 = id * 1.5, c = 'again' WHERE id <= 3")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    after = _bronze(lakehouse).schema.field("after").type
    fields = {after.field(i).name: after.field(i) for i in range(after.num_fields)}
    assert fields["c__v2"].metadata[b"pgcdc.column"] == b"c"
    assert fields["c__v2__v2"].metadata[b"pgcdc.column"] == b"c__v2"
    assert_silver_equals_source(pg_conn, table_uri(str(lakehouse), "silver", "public", "s"),
                                "public", "s", ["id"])
    silver = DeltaTable(table_uri(str(lakehouse), "silver", "public", "s"))
    assert {"c", "c__v2"} <= set(pa.schema(silver.schema().to_arrow()).names)
