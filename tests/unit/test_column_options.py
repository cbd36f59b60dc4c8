"""Column options: parsing, selection, mappers, custom keys, stream shaping.

Seed-inventory IDs: CFG-36/37/38 (column lists, message.key.columns), CFG-46/47/48 and
TYPE-13/14/15 (truncate, mask, propagate source type), TYPE-16 and EVT-05/06 (key columns
are always kept; custom keys). Hash-mask vectors are Debezium's own MaskStringsTest values.
"""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST, Column, Relation, TableChanges
from pgcdc_dagster.cdc.column_mappers import (
    Hash,
    MappedConverter,
    Mask,
    Propagate,
    Truncate,
    hash_value,
    java_serialized_string,
    java_truncate,
    source_type_parameters,
)
from pgcdc_dagster.cdc.column_options import (
    ColumnOptions,
    parse_column_options,
    project_changes,
    split_regex_list,
)
from pgcdc_dagster.cdc.envelope import SourceIdentity, bronze_from_changes
from pgcdc_dagster.cdc.typeconv import PgType, TypeModes, converter_for
from pgcdc_dagster.exceptions import ConfigurationError

pytestmark = pytest.mark.unit


def pg(oid: int, name: str, category: str = "U", **kw) -> PgType:
    return PgType(oid, "pg_catalog", name, "b", category, **kw)


INT4, INT8, TEXT = pg(23, "int4", "N"), pg(20, "int8", "N"), pg(25, "text", "S")
VARCHAR, BPCHAR, NUMERIC = pg(1043, "varchar", "S"), pg(1042, "bpchar", "S"), pg(1700, "numeric")
FLOAT8, BOOL, DATE = pg(701, "float8", "N"), pg(16, "bool", "B"), pg(1082, "date", "D")
TS, TSTZ, JSONB = pg(1114, "timestamp", "D"), pg(1184, "timestamptz", "D"), pg(3802, "jsonb")
INT4_ARRAY = pg(1007, "_int4", "A", element=INT4)
EMAIL = PgType(70000, "public", "email", "d", "S", base=VARCHAR, base_typmod=20 + 4)
TYPES = {t.oid: t for t in (INT4, INT8, TEXT, VARCHAR, BPCHAR, NUMERIC, FLOAT8, BOOL, DATE, TS,
                            TSTZ, JSONB, INT4_ARRAY, EMAIL)}

USERS = Relation(1, "public", "users", "d", (
    Column("id", 23, -1, True), Column("name", 25, -1, False),
    Column("ssn", 1043, 11 + 4, False), Column("born", 1082, -1, False),
    Column("score", 701, -1, False), Column("email", 70000, -1, False),
    Column("tenant", 20, -1, False)))


def converters(relation: Relation = USERS, modes: TypeModes | None = None):
    return [converter_for(c.name, TYPES[c.type_oid], c.typmod, modes or TypeModes())
            for c in relation.columns]


def shape(*pairs: tuple[str, str], relation: Relation = USERS):
    return ColumnOptions.parse(pairs).shape(relation, converters(relation), TYPES)


def bronze(conv, *values):
    return conv.to_bronze(pa.array(list(values), pa.string())).to_pylist()


# --- parsing ---------------------------------------------------------------------------

def test_split_regex_list_keeps_quantifiers_and_escaped_commas():
    assert split_regex_list(r" a\.b , c{1,3}, [x,y]z, d\,e ,, ") == \
        [r"a\.b", "c{1,3}", "[x,y]z", "d,e"]
    # Inside a character class a bracket opens nothing; a leading ']' is a member;
    # an escaped backslash does not escape the comma after it.
    assert split_regex_list(r"a[(]b,c[])],d[^]{],e,f\\,g") == \
        ["a[(]b", "c[])]", "d[^]{]", "e", "f\\\\", "g"]


@pytest.mark.parametrize(("pairs", "message"), [
    ([("column.include.list", "a"), ("column.exclude.list", "b")], "cannot be used together"),
    ([("column.truncate.to.0.chars", "a")], "positive"),
    ([("column.mask.hash.MD2.with.salt.s", "a")], "MD2"),
    ([("column.include.list", "a(")], "not a valid regular expression"),
    ([("message.key.columns", "public.t")], "message.key.columns"),
    ([("message.key.columns", "public.t:")], "message.key.columns"),
    ([("column.mask.with.x.chars", "a")], "not a column option"),
    ([("column.masks", "a")], "not a column option"),
])
def test_parse_rejects_bad_options(pairs, message):
    with pytest.raises(ConfigurationError, match=message):
        ColumnOptions.parse(pairs)


def test_parse_accepts_every_option_and_aliases():
    options = parse_column_options((
        ("column.blacklist", r"public\.users\.born"),
        ("column.mask.with.0.chars", r"public\.users\.a"),
        ("column.mask.hash.SHA-256.with.salt.CzQMA0cB5K", r"public\.users\.b"),
        ("column.mask.hash.v2.md5.with.salt.s.a.l.t", r"public\.users\.c"),
        ("column.truncate.to.3.chars", r"public\.users\.d"),
        ("column.propagate.source.type", r"public\.users\.z.*"),
        ("message.key.columns", r"public.users:tenant,id;other.t:x"),
        ("column.include.list", "  "),  # blank values are ignored, as Debezium's defaults
    ))
    assert options and not options.captures("public", "users", "born")
    assert options.captures("PUBLIC", "Users", "name")  # case-insensitive (Debezium)
    assert options.mapper_for("public", "users", "a") == Mask(0)
    assert options.mapper_for("public", "users", "b") == Hash("SHA-256", "CzQMA0cB5K")
    assert options.mapper_for("public", "users", "c") == Hash("md5", "s.a.l.t", v2=True)
    assert options.mapper_for("public", "users", "d") == Truncate(3)
    assert options.mapper_for("public", "users", "zzz") == Propagate()
    assert not ColumnOptions.parse([])


def test_first_matching_rule_wins_in_debezium_order():
    """ColumnMappers.mapperFor: truncations, masks, propagation, hashes, hashes v2."""
    options = ColumnOptions.parse([
        ("column.mask.hash.v2.SHA-256.with.salt.x", ".*"),
        ("column.mask.hash.SHA-256.with.salt.x", r".*\.h1"),
        ("column.propagate.source.type", r".*\.p"),
        ("column.mask.with.4.chars", r".*\.(m|p)"),
        ("column.truncate.to.9.chars", r".*\.(t|m)"),
    ])
    assert options.mapper_for("s", "t", "t") == Truncate(9)
    assert options.mapper_for("s", "t", "m") == Truncate(9)
    assert options.mapper_for("s", "t", "p") == Mask(4)
    assert options.mapper_for("s", "t", "h1") == Hash("SHA-256", "x")
    assert options.mapper_for("s", "t", "other") == Hash("SHA-256", "x", v2=True)


def test_include_list_matches_the_whole_qualified_name():
    options = ColumnOptions.parse([("column.include.list", r"public\.users\.na")])
    assert not options.captures("public", "users", "name")
    assert options.captures("public", "users", "NA")


# --- selection and keys (CFG-36..38, EVT-05/06, TYPE-16) ---------------------------------

def test_exclude_list_never_removes_key_columns():
    rel, convs = shape(("column.exclude.list", r"public\.users\.(id|born|score)"))
    assert [c.name for c in rel.columns] == ["id", "name", "ssn", "email", "tenant"]
    assert [c.bronze_field.name for c in convs] == [c.name for c in rel.columns]
    assert rel.key_names == ("id",)


def test_include_list_keeps_key_columns():
    rel, _ = shape(("column.include.list", r"public\.users\.name"))
    assert [c.name for c in rel.columns] == ["id", "name"]


def test_message_key_columns_rekeys_in_table_order():
    rel, _ = shape(("message.key.columns", "public.users:tenant,name"))
    assert rel.key_names == ("name", "tenant")
    # an item for another table leaves this one on its primary key
    rel, _ = shape(("message.key.columns", "other.users:tenant"))
    assert rel.key_names == ("id",)
    # the table part is a regular expression (Debezium joins it to the column with '.')
    rel, _ = shape(("message.key.columns", r"pub.*\.users:tenant"))
    assert rel.key_names == ("tenant",)


def test_custom_key_columns_are_kept_even_when_excluded():
    rel, _ = shape(("message.key.columns", "public.users:tenant"),
                   ("column.exclude.list", r"public\.users\.tenant"))
    assert "tenant" in [c.name for c in rel.columns] and rel.key_names == ("tenant",)


@pytest.mark.parametrize("prop", ["column.mask.with.3.chars", "column.mask.hash.MD5.with.salt.s",
                                  "column.truncate.to.2.chars"])
def test_key_columns_cannot_be_masked_hashed_or_truncated(prop):
    with pytest.raises(ConfigurationError, match="key column"):
        shape(("message.key.columns", "public.users:name"), (prop, r"public\.users\.name"))


def test_truncating_a_non_character_key_is_a_no_op():
    _, convs = shape(("column.truncate.to.2.chars", r"public\.users\.id"))
    assert isinstance(convs[0], MappedConverter) and not convs[0].applies
    assert bronze(convs[0], "12345") == [12345]


# --- mask (CFG-47, TYPE-14) -------------------------------------------------------------

def test_mask_replaces_every_value_with_asterisks_and_becomes_a_string():
    _, convs = shape(("column.mask.with.5.chars", r"public\.users\.(ssn|score)"))
    ssn, score = convs[2], convs[4]
    assert bronze(ssn, "123-45-6789", None) == ["*****", "*****"]  # NULL too, as Debezium
    assert score.bronze_field.type == pa.string()
    assert bronze(score, "1.5") == ["*****"]
    assert score.connect_schema() == {"type": "string", "optional": True,
                                      "parameters": {"masked": "true"}, "field": "score"}
    assert score.silver_field.type == pa.string()
    assert score.to_silver(pa.array(["2.5"])).to_pylist() == ["*****"]
    assert score.bronze_placeholder().as_py() == "*****"
    assert ColumnOptions.parse([("column.mask.with.0.chars", ".*")]).mapper_for(
        "a", "b", "c") == Mask(0)


# --- hash masks (Debezium MaskStrings) -----------------------------------------------------

def test_hash_vectors_match_debezium():
    """Debezium's MaskStringsTest: salt "salt"; v1 hashes the Java-serialised String."""
    assert hash_value("hello", Hash("SHA-256", "salt")) == \
        "af5843a0f0e728ab0332c8888b6e1190bfb79e584f0d40538de8f10df6ef29c6"
    assert hash_value("world", Hash("SHA-256", "salt")) == \
        "4588e1f2dcdc7fefc1515d3acd5acb9033478eace68286f383c337b9ff4464a3"
    assert hash_value("hello", Hash("MD5", "salt")) == "46f48a7a5ea32efba87cbff49d46d35a"
    assert hash_value("hello", Hash("SHA-256", "salt", v2=True)) == \
        "cd31b3b98ece60cb739c0bf770b2de892ae0ad133f645513c3d83f08757a843a"
    assert hash_value("world", Hash("MD5", "salt", v2=True)) == \
        "172c8e95398cc72ab5358ead6981e7e5"


def test_java_serialisation_of_strings():
    assert java_serialized_string("hi") == b"\xac\xed\x00\x05\x74\x00\x02hi"
    # NUL as C0 80, supplementary characters as two 3-byte surrogates (modified UTF-8)
    assert java_serialized_string("\x00\U0001F600")[7:] == \
        b"\xc0\x80\xed\xa0\xbd\xed\xb8\x80"
    long = java_serialized_string("x" * 70000)
    assert long[4] == 0x7C and int.from_bytes(long[5:13], "big") == 70000


def test_hash_column_is_a_hex_string_cut_to_the_declared_length():
    _, convs = shape(("column.mask.hash.SHA-256.with.salt.salt", r"public\.users\.(name|ssn)"),
                     ("column.mask.hash.v2.SHA-256.with.salt.salt", r"public\.users\.tenant"))
    name, ssn, tenant = convs[1], convs[2], convs[6]
    full = "af5843a0f0e728ab0332c8888b6e1190bfb79e584f0d40538de8f10df6ef29c6"
    assert bronze(name, "hello", None) == [full, None]
    assert bronze(ssn, "hello") == [full[:11]]  # varchar(11)
    # a non-character column hashes its text form (Debezium hashes character columns only)
    assert bronze(tenant, "42") == [hash_value("42", Hash("SHA-256", "salt", v2=True))]
    assert tenant.bronze_field.type == pa.string()
    assert name.connect_schema()["parameters"] == {"masked": "true"}
    assert name.bronze_placeholder().as_py() == hash_value("__debezium_unavailable_value",
                                                           Hash("SHA-256", "salt"))


def test_hash_of_not_null_fallback_is_the_hash_of_the_empty_string():
    conv = converter_for("name", TEXT, -1, TypeModes(), nullable=False)
    mapped = MappedConverter(conv, Hash("MD5", "s", v2=True), TEXT, -1)
    assert bronze(mapped, None) == [hash_value("", Hash("MD5", "s", v2=True))]
    assert mapped.bronze_fallback().as_py() == hash_value("", Hash("MD5", "s", v2=True))
    assert mapped.connect_schema()["optional"] is False


# --- truncate (CFG-46, TYPE-13) -------------------------------------------------------------

def test_truncate_cuts_character_values_and_marks_the_schema():
    _, convs = shape(("column.truncate.to.4.chars", r"public\.users\.(name|ssn|email|born)"))
    name, ssn, born, email = convs[1], convs[2], convs[3], convs[5]
    assert bronze(name, "Kretchmar", "Ann", None) == ["Kret", "Ann", None]
    assert bronze(name, "\U0001F600\U0001F600\U0001F600", "日本語テ") == \
        ["\U0001F600\U0001F600", "日本語テ"]  # 4 UTF-16 units each
    assert name.connect_schema()["parameters"] == {"truncateLength": "4"}
    assert name.to_silver(pa.array(["abcdef"])).to_pylist() == ["abcd"]
    assert bronze(ssn, "123-45-6789") == ["123-"]  # varchar(11) > 4
    assert bronze(email, "a@example.org") == ["a@ex"]  # domain over varchar(20)
    # a non-character column is passed through without the parameter
    assert not born.applies and "parameters" not in born.connect_schema()
    assert bronze(born, "2024-01-02") == bronze(converter_for("b", DATE, -1, TypeModes()),
                                                "2024-01-02")
    assert name.bronze_placeholder().as_py() == "__de"


def test_truncate_skips_columns_no_longer_than_the_limit():
    _, convs = shape(("column.truncate.to.20.chars", r"public\.users\.ssn"))
    assert not convs[2].applies and "parameters" not in convs[2].connect_schema()


def test_java_truncate_counts_utf16_code_units():
    assert java_truncate("日本語テキスト", 3) == "日本語"
    assert java_truncate("a\U0001F600b", 2) == "a"  # never half a surrogate pair
    assert java_truncate("a\U0001F600b", 3) == "a\U0001F600"
    assert java_truncate("abc", 5) == "abc"


# --- propagate source type (CFG-48, TYPE-15) -------------------------------------------------

@pytest.mark.parametrize(("pgtype", "typmod", "expected"), [
    (VARCHAR, 255 + 4, ("VARCHAR", "255", "0")),
    (VARCHAR, -1, ("VARCHAR", "2147483647", "0")),
    (BPCHAR, 3 + 4, ("BPCHAR", "3", "0")),
    (TEXT, -1, ("TEXT", "2147483647", "0")),
    (NUMERIC, ((10 << 16) | 2) + 4, ("NUMERIC", "10", "2")),
    (NUMERIC, -1, ("NUMERIC", "131089", "0")),
    (INT4, -1, ("INT4", "10", "0")),
    (INT8, -1, ("INT8", "19", "0")),
    (FLOAT8, -1, ("FLOAT8", "17", "17")),
    (BOOL, -1, ("BOOL", "1", "0")),
    (DATE, -1, ("DATE", "13", "0")),
    (TS, -1, ("TIMESTAMP", "29", "6")),
    (TSTZ, 3, ("TIMESTAMPTZ", "32", "3")),
    (JSONB, -1, ("JSONB", "2147483647", "0")),
    (INT4_ARRAY, -1, ("_INT4", "10", "0")),
    (EMAIL, -1, ("EMAIL", "20", "0")),
])
def test_source_type_parameters_follow_pgjdbc(pgtype, typmod, expected):
    params = dict(source_type_parameters(pgtype, typmod))
    assert (params["__debezium.source.column.type"], params["__debezium.source.column.length"],
            params["__debezium.source.column.scale"]) == expected


def test_propagate_adds_parameters_and_keeps_values():
    rel = Relation(1, "public", "p", "d", (Column("id", 23, -1, True),
                                          Column("amount", 1700, ((10 << 16) | 2) + 4, False)))
    _, convs = shape(("column.propagate.source.type", r"public\.p\.amount"), relation=rel)
    amount = convs[1]
    assert amount.connect_schema()["parameters"] == {
        "scale": "2", "connect.decimal.precision": "10",
        "__debezium.source.column.type": "NUMERIC", "__debezium.source.column.length": "10",
        "__debezium.source.column.scale": "2"}
    assert amount.bronze_field.type == pa.binary()
    assert bronze(amount, "12.34") == [b"\x04\xd2"]
    assert str(amount.silver_field.type) == "decimal128(10, 2)"
    assert amount.from_bronze(pa.array([b"\x04\xd2"])).to_pylist()[0] == \
        converters(rel)[1].to_silver(pa.array(["12.34"])).to_pylist()[0]
    meta = amount.bronze_field.metadata
    assert meta[b"pg.type"] == b"pg_catalog.numeric"
    assert b"__debezium.source.column.type" in meta[b"debezium.schema"]


def test_mapped_converters_pickle():
    _, convs = shape(("column.mask.hash.SHA-256.with.salt.x", r"public\.users\.name"),
                     ("column.truncate.to.2.chars", r"public\.users\.ssn"))
    for conv in convs[1:3]:
        back = pickle.loads(pickle.dumps(conv))
        assert bronze(back, "abc") == bronze(conv, "abc")
        assert back.connect_schema() == conv.connect_schema()


# --- the stream: projecting segments ---------------------------------------------------------

def _segment(relation: Relation) -> TableChanges:
    seg = TableChanges(relation)
    for op, before, after in [
        ("c", None, (b"1", b"Ann", b"123-45-6789", b"2000-01-01", b"1.5", b"a@b.c", b"7")),
        ("u", None, (b"1", UNCHANGED_TOAST, b"999", b"2000-01-01", b"2.5", b"a@b.c", b"7")),
        ("d", (b"1", None, None, None, None, None, None), None),
    ]:
        seg.op.append(op)
        seg.before.append(before)
        seg.before_key_only.append(before is not None)
        seg.after.append(after)
        for name in ("commit_lsn", "lsn", "xid", "commit_ts_us", "total_order",
                     "collection_order"):
            getattr(seg, name).append(1)
        seg.truncate_options.append(0)
    return seg


def test_project_changes_keeps_named_columns_in_order():
    seg = project_changes(_segment(USERS), ["id", "ssn"])
    assert [c.name for c in seg.relation.columns] == ["id", "ssn"]
    assert seg.after[0] == (b"1", b"123-45-6789") and seg.after[2] is None
    assert seg.before[2] == (b"1", None)
    assert seg.op == ["c", "u", "d"]


def _context(*pairs: tuple[str, str]) -> TableContext:
    options = ColumnOptions.parse(pairs)
    rel, convs = options.shape(USERS, converters(), TYPES)
    return TableContext(rel, convs, "b", "s", "ba", "sa", options)


def test_context_shape_uses_its_own_converters_for_its_shape():
    ctx = _context(("column.exclude.list", r"public\.users\.(born|score)"),
                   ("column.mask.with.3.chars", r"public\.users\.ssn"),
                   ("message.key.columns", "public.users:tenant"))
    seg, convs = ctx.shape(_segment(USERS), converters)
    assert seg.relation.columns == ctx.relation.columns and convs is ctx.converters
    table = bronze_from_changes(seg, convs, SourceIdentity("p", "db"), 1)
    rows = table.to_pylist()
    assert rows[0]["after"] == {"id": 1, "name": "Ann", "ssn": "***", "email": "a@b.c",
                                "tenant": 7}
    assert rows[0]["key"] == {"tenant": 7}
    assert rows[1]["__toast_unchanged"] == ["name"]


def test_context_shape_handles_a_column_added_mid_stream():
    ctx = _context(("column.mask.with.3.chars", r"public\.users\.(ssn|extra)"),
                   ("column.exclude.list", r"public\.users\.hidden"))
    wider = Relation(1, "public", "users", "d", (*USERS.columns,
                                                 Column("extra", 25, -1, False),
                                                 Column("hidden", 25, -1, False)))
    seg = _segment(USERS)
    seg.relation = wider
    seg.after = [None if r is None else (*r, b"x", b"secret") for r in seg.after]
    seg.before = [None if r is None else (*r, None, None) for r in seg.before]
    out, convs = ctx.shape(seg, converters)
    assert [c.name for c in out.relation.columns][-1] == "extra"
    assert [c.bronze_field.name for c in convs] == [c.name for c in out.relation.columns]
    rows = bronze_from_changes(out, convs, SourceIdentity("p", "db"), 1).to_pylist()
    assert rows[0]["after"]["extra"] == "***" and "hidden" not in rows[0]["after"]
    _, convs2 = ctx.shape(_segment(USERS), converters)
    assert convs2 is ctx.converters


def test_new_stream_shape_keeps_the_contexts_converters_for_known_columns():
    """Same schemas (and Delta field metadata) for the columns the context knows, so the
    bronze schema merge of a column added mid-stream only adds the new column."""
    ctx = _context(("column.propagate.source.type", r"public\.users\.name"))
    wider = Relation(1, "public", "users", "d", (*USERS.columns,
                                                 Column("extra", 25, -1, False)))
    seg = _segment(USERS)
    seg.relation = wider
    seg.after = [None if r is None else (*r, b"x") for r in seg.after]
    seg.before = [None if r is None else (*r, None) for r in seg.before]
    _, convs = ctx.shape(seg, converters)
    assert all(a is b for a, b in zip(convs, ctx.converters, strict=False))
    retyped = Relation(1, "public", "users", "d", (
        *USERS.columns[:1], Column("name", 1043, 20 + 4, False), *USERS.columns[2:]))
    seg = _segment(USERS)
    seg.relation = retyped
    _, convs = ctx.shape(seg, converters)
    assert convs[1] is not ctx.converters[1] and convs[0] is ctx.converters[0]
    assert convs[1].connect_schema()["parameters"]["__debezium.source.column.type"] == \
        "VARCHAR"


def test_capture_resource_passes_column_options_in_debezium_syntax():
    from pgcdc_dagster.resources.capture import CaptureResource

    resource = CaptureResource(
        column_exclude_list=r"public\.users\.secret",
        message_key_columns="public.users:tenant",
        column_mappers={"column.mask.with.4.chars": r"public\.users\.ssn",
                        "column.mask.hash.v2.SHA-256.with.salt.pepper": r"public\.users\.name"})
    settings = resource.settings("dbname=x", "/tmp/lake")
    assert settings.column_options == (
        ("column.exclude.list", r"public\.users\.secret"),
        ("message.key.columns", "public.users:tenant"),
        ("column.mask.with.4.chars", r"public\.users\.ssn"),
        ("column.mask.hash.v2.SHA-256.with.salt.pepper", r"public\.users\.name"))
    options = parse_column_options(settings.column_options)
    assert options.mapper_for("public", "users", "ssn") == Mask(4)
    with pytest.raises(ConfigurationError, match="not a column option"):
        CaptureResource(column_mappers={"column.mask.chars": "x"}).settings("d", "l")
