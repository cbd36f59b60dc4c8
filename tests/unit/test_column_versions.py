"""Versioned bronze fields after a column's type change, the schema history keyed by LSN, and
the evolution helpers (docs/types.md "Schema changes").

Encodings are the seeds' (TYPE-01 integers, TYPE-04 Decimal scale, TYPE-08 Timestamp /
MicroTimestamp); the tests check that a field is reused exactly when its stored values read
the same under the new encoding.
"""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.changes import Column, Relation, TableChanges
from pgcdc_dagster.cdc.column_options import ColumnOptions
from pgcdc_dagster.cdc.column_versions import (
    COLUMN_META,
    VersionedConverter,
    assign_field,
    column_of,
    compatible,
    renamed,
    silver_values,
    version_of,
    versions,
)
from pgcdc_dagster.cdc.typeconv import PgType, TypeModes, converter_for
from pgcdc_dagster.lake.evolution import evolve, merged_fields, with_table_metadata
from pgcdc_dagster.lake.schema_history import HistoryRecorder, Shape, read_history, shape_at

pytestmark = pytest.mark.unit

OIDS = {"int4": 23, "int8": 20, "text": 25, "varchar": 1043, "numeric": 1700,
        "timestamp": 1114}


def pg(name: str, typtype: str = "b", labels: tuple[str, ...] = ()) -> PgType:
    return PgType(OIDS.get(name, 0), "pg_catalog", name, typtype, "U", enum_labels=labels)


def conv(name: str, typmod: int = -1, column: str = "c"):
    return converter_for(column, pg(name), typmod, TypeModes())  # type: ignore[arg-type]


def numeric(p: int, s: int) -> int:
    return ((p << 16) | s) + 4


def field(name: str, typmod: int = -1, column: str = "c") -> pa.Field:
    return conv(name, typmod, column).bronze_field


def test_compatible_only_when_stored_values_read_the_same():
    assert compatible(field("varchar", 10 + 4), field("varchar", 30 + 4))
    assert compatible(field("varchar", 10 + 4), field("text"))
    assert compatible(field("numeric", numeric(10, 2)), field("numeric", numeric(12, 2)))
    assert not compatible(field("numeric", numeric(10, 2)), field("numeric", numeric(12, 4)))
    assert not compatible(field("int4"), field("int8"))
    assert not compatible(field("int4"), field("text"))
    # same INT64 storage, other unit (Timestamp ms vs MicroTimestamp us): a new field
    assert not compatible(field("timestamp", 3), field("timestamp", 6))
    # enum labels added: the stored strings read the same
    a = converter_for("c", pg("mood", "e", ("a",)), -1, TypeModes()).bronze_field
    b = converter_for("c", pg("mood", "e", ("a", "b")), -1, TypeModes()).bronze_field
    assert compatible(a, b)
    # NOT NULL (required schema) changes nothing stored
    required = converter_for("c", pg("int4"), -1, TypeModes(), nullable=False).bronze_field
    assert compatible(field("int4"), required)


def test_assign_field_versions_in_order():
    int4, int8, text = field("int4"), field("int8"), field("text")
    assert assign_field("c", int4, []) == "c"
    assert assign_field("c", int4, [int4]) == "c"
    assert assign_field("c", int8, [int4]) == "c__v2"
    v2 = renamed(conv("int8"), "c__v2").bronze_field
    assert assign_field("c", int8, [int4, v2]) == "c__v2"
    # a change back to int is a new version too: the newest field decides
    assert assign_field("c", int4, [int4, v2]) == "c__v3"
    assert assign_field("c", text, [int4, v2]) == "c__v3"
    # in a run: old-shape events keep the committed field; a pending choice is reused
    assert assign_field("c", int4, [int4], pending=[v2]) == "c"
    assert assign_field("c", int8, [int4], pending=[v2]) == "c__v2"
    # a real column named like a version is not mistaken for one
    other = field("int4", column="c__v2")
    assert column_of(other) == "c__v2" and version_of(other) == 1
    assert versions([int4, other, v2], "c") == [int4, v2]


def test_versioned_names_never_take_another_columns_name():
    """A real column ``c__v2`` (any letter case) and ``c``'s versions stay apart."""
    int4, int8 = field("int4"), field("int8")
    real = field("text", column="c__v2")
    # the real column is committed, or only in the table (new in this run), or differs in case
    assert assign_field("c", int8, [int4, real]) == "c__v3"
    assert assign_field("c", int8, [int4], columns=["c", "c__v2"]) == "c__v3"
    assert assign_field("c", int8, [int4], columns=["c", "C__V2", "c__v3"]) == "c__v4"
    assert assign_field("c__v2", real, [int4, real]) == "c__v2"
    # a column added under the name of c's existing versioned field gets a field of its own
    v2 = renamed(conv("int8"), "c__v2").bronze_field
    added = field("text", column="c__v2")
    name = assign_field("c__v2", added, [int4, v2], columns=["c", "c__v2"])
    assert name == "c__v2__v2"
    stored = renamed(conv("text", column="c__v2"), name).bronze_field
    assert column_of(stored) == "c__v2" and version_of(stored) == 2
    assert versions([int4, v2, stored], "c") == [int4, v2]
    assert versions([int4, v2, stored], "c__v2") == [stored]
    # and each keeps its field afterwards; the next change of either skips the other's names
    assert assign_field("c", int8, [int4, v2, stored], columns=["c", "c__v2"]) == "c__v2"
    assert assign_field("c__v2", added, [int4, v2, stored], columns=["c", "c__v2"]) == name
    assert assign_field("c", int4, [int4, v2, stored], columns=["c", "c__v2"]) == "c__v3"


def test_versioned_converter_keeps_the_columns_schema_and_values():
    base = conv("int8")
    v = renamed(base, "c__v2")
    assert isinstance(v, VersionedConverter)
    assert v.bronze_field.name == "c__v2" and v.bronze_field.metadata[COLUMN_META] == b"c"
    assert v.bronze_field.type == pa.int64() and v.silver_field.name == "c"
    assert v.connect_schema() == {"type": "int64", "optional": True, "field": "c"}
    text = pa.array(["5000000000", None])
    assert v.to_bronze(text).to_pylist() == [5000000000, None]
    assert v.to_silver(text).equals(base.to_silver(text))
    assert renamed(base, "c") is base
    again = pickle.loads(pickle.dumps(v))
    assert again.bronze_field == v.bronze_field and again.pgtype == base.pgtype


def test_silver_values_reads_each_event_from_its_field():
    old = conv("int4")
    new = renamed(conv("int8"), "c__v2", superseded=[old])
    children = {"c": pa.array([1, None, None], pa.int32()),
                "c__v2": pa.array([None, 5000000000, None], pa.int64())}
    assert silver_values(new, children, 3).to_pylist() == [1, 5000000000, None]
    # numeric(10,2) -> numeric(12,4): old unscaled bytes decoded at scale 2, then cast
    dec_old = conv("numeric", numeric(10, 2))
    dec_new = renamed(conv("numeric", numeric(12, 4)), "c__v2", superseded=[dec_old])
    children = {"c": dec_old.to_bronze(pa.array(["12.34", None])),
                "c__v2": dec_new.to_bronze(pa.array([None, "1.2345"]))}
    out = silver_values(dec_new, children, 2)
    assert out.type == pa.decimal128(12, 4)
    assert [str(x) for x in out.to_pylist()] == ["12.3400", "1.2345"]
    # a column added after the events reads null
    assert silver_values(conv("text", column="z"), {}, 2).to_pylist() == [None, None]


REL = Relation(1, "public", "t", "d", (Column("id", 23, -1, True), Column("c", 23, -1, False)))


def _segment(relation: Relation, values: list[bytes], lsn: int) -> TableChanges:
    seg = TableChanges(relation)
    for i, v in enumerate(values):
        seg.op.append("c")
        seg.commit_lsn.append(lsn)
        seg.lsn.append(lsn + i)
        seg.xid.append(7)
        seg.commit_ts_us.append(0)
        seg.total_order.append(i + 1)
        seg.collection_order.append(i + 1)
        seg.before.append(None)
        seg.after.append((str(i).encode(), v))
    return seg


def test_context_shape_versions_a_changed_column_and_records_history(tmp_path):
    """Mid-run: the context was built for ``c int``; a segment arrives with ``c bigint``."""
    convs = (conv("int4", column="id"), conv("int4"))
    uri = str(tmp_path / "history")
    ctx = TableContext(REL, convs, "b", "s", "ba", "sa", ColumnOptions(),
                       committed=tuple(c.bronze_field for c in convs),
                       history=HistoryRecorder(uri, "public", "t"))
    wider = Relation(1, "public", "t", "d", (REL.columns[0], Column("c", 20, -1, False)))

    def plain(relation: Relation):
        return [conv("int4" if col.type_oid == 23 else "int8", column=col.name)
                for col in relation.columns]

    _, same = ctx.shape(_segment(REL, [b"1"], 100), plain)
    assert same is ctx.converters
    _, changed = ctx.shape(_segment(wider, [b"5000000000"], 200), plain)
    assert [c.bronze_field.name for c in changed] == ["id", "c__v2"]
    ctx.shape(_segment(REL, [b"2"], 300), plain)  # and back: the committed field again
    history = read_history(uri, "public", "t")
    assert [(e.lsn, e.ordinal) for e in history] == [(100, 1), (200, 1), (300, 1)]
    cols = history[1].shape.parsed()
    assert cols[1] == {"name": "c", "field": "c__v2", "key": False,
                       "schema": {"type": "int64", "optional": True}}
    assert history[0].shape.shape_id == history[2].shape.shape_id
    assert shape_at(history, 250, 5) == history[1] and shape_at(history, 99, 0) is None
    # a replay records nothing new
    recorder = HistoryRecorder(uri, "public", "t")
    assert not recorder.record(Shape.of(wider, changed), 200, 1)
    assert len(read_history(uri, "public", "t")) == 3


def test_key_type_change_mid_run_is_refused():
    from pgcdc_dagster.lake.evolution import SchemaChangeError

    convs = (conv("int4", column="id"), conv("int4"))
    ctx = TableContext(REL, convs, "b", "s", "ba", "sa", ColumnOptions(),
                       committed=tuple(c.bronze_field for c in convs))
    rekeyed = Relation(1, "public", "t", "d", (Column("id", 20, -1, True), REL.columns[1]))
    with pytest.raises(SchemaChangeError, match="key column id"):
        ctx.shape(_segment(rekeyed, [b"1"], 100),
                  lambda r: [conv("int8", column="id"), conv("int4")])


def test_evolve_keeps_the_tables_metadata_and_adds_new_fields(tmp_path):
    uri = str(tmp_path / "t")
    first = pa.schema([pa.field("a", pa.int32(), metadata={"pg.typmod": "14"}),
                       pa.field("s", pa.struct([pa.field("x", pa.int32())]))])
    write_deltalake(uri, first.empty_table())
    table = DeltaTable(uri)
    incoming = pa.schema([pa.field("a", pa.int32(), metadata={"pg.typmod": "34"}),
                          pa.field("s", pa.struct([pa.field("x", pa.int32()),
                                                   pa.field("y", pa.string())])),
                          pa.field("b", pa.int64())])
    assert [f.name for f in merged_fields(first, incoming)] == ["a", "s", "b"]
    merged = evolve(table, incoming, "t")
    assert merged.field("a").metadata == {b"pg.typmod": b"14"}
    assert merged.field("s").type.get_field_index("y") == 1 and "b" in merged.names
    rows = pa.Table.from_pylist([{"a": 1, "s": {"x": 1, "y": "q"}, "b": 2}], schema=incoming)
    assert with_table_metadata(rows, merged).schema.field("a").metadata == \
        {b"pg.typmod": b"14"}


def test_evolve_rewrites_a_derived_table_to_the_new_type(tmp_path):
    from pgcdc_dagster.lake.evolution import SchemaChangeError

    uri = str(tmp_path / "silver")
    write_deltalake(uri, pa.table({"id": pa.array([1, 2], pa.int32()),
                                   "n": pa.array([7, None], pa.int32())}))
    table = DeltaTable(uri)
    wider = pa.schema([pa.field("id", pa.int32()), pa.field("n", pa.int64())])
    with pytest.raises(SchemaChangeError, match="Re-snapshot"):
        evolve(table, wider, "bronze")
    evolve(table, wider, "silver", cast_changed=True)
    out = DeltaTable(uri).to_pyarrow_table().sort_by("id")
    assert out.schema.field("n").type == pa.int64() and out["n"].to_pylist() == [7, None]
    as_text = pa.schema([pa.field("id", pa.int32()), pa.field("n", pa.string())])
    evolve(DeltaTable(uri), as_text, "silver", cast_changed=True)
    assert DeltaTable(uri).to_pyarrow_table().sort_by("id")["n"].to_pylist() == ["7", None]
    write_deltalake(uri, pa.table({"id": pa.array([3], pa.int32()), "n": pa.array(["x"])}),
                    mode="append")
    with pytest.raises(SchemaChangeError, match="does not convert"):
        evolve(DeltaTable(uri), wider, "silver", cast_changed=True)


def test_history_restarts_for_a_table_without_events(tmp_path):
    """A torn-down (or never committed) table starts its history afresh: a stale later
    entry would otherwise shadow the new snapshot's shape."""
    uri = str(tmp_path / "history")
    wide = Shape.of(REL, (conv("int4", column="id"), conv("int4")))
    narrow = Shape.of(Relation(1, "public", "t", "d", REL.columns[:1]),
                      (conv("int4", column="id"),))
    old = HistoryRecorder(uri, "public", "t")
    old.record(wide, 0, 0)
    old.record(narrow, 500, 1)
    other = HistoryRecorder(uri, "public", "o'q")
    other.record(wide, 0, 0)
    fresh = HistoryRecorder(uri, "public", "t")
    fresh.restart(wide)
    assert [(e.lsn, e.shape) for e in read_history(uri, "public", "t")] == [(0, wide)]
    assert shape_at(read_history(uri, "public", "t"), 900, 1).shape == wide
    assert len(read_history(uri, "public", "o'q")) == 1
    fresh.restart(wide)  # nothing to do the second time
    assert DeltaTable(uri).version() == 5  # create, 3 records, delete, record


def test_two_type_changes_of_a_column_in_one_run_get_two_versions():
    convs = (conv("int4", column="id"), conv("int4"))
    ctx = TableContext(REL, convs, "b", "s", "ba", "sa", ColumnOptions(),
                       committed=tuple(c.bronze_field for c in convs))
    to_int8 = Relation(1, "public", "t", "d", (REL.columns[0], Column("c", 20, -1, False)))
    to_text = Relation(1, "public", "t", "d", (REL.columns[0], Column("c", 25, -1, False)))
    names = {23: "int4", 20: "int8", 25: "text"}

    def plain(relation: Relation):
        return [conv(names[col.type_oid], column=col.name) for col in relation.columns]

    _, first = ctx.shape(_segment(to_int8, [b"5000000000"], 200), plain)
    _, second = ctx.shape(_segment(to_text, [b"x"], 300), plain)
    _, again = ctx.shape(_segment(to_int8, [b"1"], 400), plain)
    assert first[1].bronze_field.name == "c__v2" and second[1].bronze_field.name == "c__v3"
    assert again is first  # a shape seen before keeps its converters


def test_values_follow_the_chain_of_type_changes(tmp_path):
    """int -> numeric(6,1) -> text: PostgreSQL converted a stored 4 to 4.0, then to '4.0';
    silver does the same, for batch events and for the rewrite of stored rows."""
    from pgcdc_dagster.cdc.column_versions import SILVER_CHAIN_META, silver_chain

    v1 = conv("int4")
    v2 = renamed(conv("numeric", numeric(6, 1)), "c__v2")
    v3 = renamed(conv("text"), "c__v3", superseded=[v2, v1])
    assert SILVER_CHAIN_META in v3.silver_field.metadata
    assert silver_chain(v3.silver_field) == [pa.int32(), pa.decimal128(6, 1), pa.string()]
    children = {"c": pa.array([4, None, None], pa.int32()),
                "c__v2": v2.to_bronze(pa.array([None, "2.5", None])),
                "c__v3": pa.array([None, None, "drei"])}
    assert silver_values(v3, children, 3).to_pylist() == ["4.0", "2.5", "drei"]
    uri = str(tmp_path / "silver")
    write_deltalake(uri, pa.table({"id": pa.array([1], pa.int32()),
                                   "c": pa.array([4], pa.int32())}))
    evolve(DeltaTable(uri), pa.schema([pa.field("id", pa.int32()), v3.silver_field]), "silver",
           cast_changed=True)
    assert DeltaTable(uri).to_pyarrow_table()["c"].to_pylist() == ["4.0"]
