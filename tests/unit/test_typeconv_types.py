"""Unit tests per type and handling mode, with the seeds' worked examples as expected values.

IDs refer to /work/shared/reference/seed-inventory.md (TYPE-*, CFG-*, D-*).
"""

from __future__ import annotations

import base64

import pyarrow as pa
import pytest

from pgcdc_dagster.cdc.typeconv import PgType, TypeModes, converter_for
from pgcdc_dagster.exceptions import ConfigurationError

pytestmark = pytest.mark.unit


def pg(name: str, *, schema: str = "pg_catalog", typtype: str = "b", **kw) -> PgType:
    return PgType(0, schema, name, typtype, kw.pop("category", "U"), **kw)


def array_of(element: PgType) -> PgType:
    return PgType(1, element.schema, "_" + element.name, "b", "A", element=element)


def conv(name: str, typmod: int = -1, **modes):
    return converter_for("c", pg(name), typmod, TypeModes(**modes))


def one(converter, text: str | None, silver: bool = False):
    arr = pa.array([text], type=pa.string())
    out = converter.to_silver(arr) if silver else converter.to_bronze(arr)
    return out.to_pylist()[0]


# --- temporal (TYPE-03..07, D-24) -------------------------------------------------------

@pytest.mark.parametrize("mode", ["adaptive", "adaptive_time_microseconds", "connect"])
def test_date_is_days_since_epoch_in_every_mode(mode):
    """TYPE-06: DATE 2018-06-20 -> 17702."""
    c = conv("date", time_precision=mode)
    assert one(c, "2018-06-20") == 17702
    assert one(c, "1969-12-31") == -1
    assert one(c, "0044-03-15 BC") == -735_160  # proleptic Gregorian, 44 BC = year -43
    expected = "org.apache.kafka.connect.data.Date" if mode == "connect" \
        else "io.debezium.time.Date"
    assert c.connect_schema()["name"] == expected and c.connect_schema()["type"] == "int32"
    assert str(one(c, "2018-06-20", silver=True)) == "2018-06-20"


@pytest.mark.parametrize(("mode", "typmod", "name", "value"), [
    ("adaptive", -1, "io.debezium.time.MicroTimestamp", 1529507596945104),
    ("adaptive_time_microseconds", -1, "io.debezium.time.MicroTimestamp", 1529507596945104),
    ("connect", -1, "org.apache.kafka.connect.data.Timestamp", 1529507596945),
    ("adaptive", 3, "io.debezium.time.Timestamp", 1529507596945),
    ("adaptive", 6, "io.debezium.time.MicroTimestamp", 1529507596945104),
])
def test_timestamp_seed_example(mode, typmod, name, value):
    """TYPE-04/TYPE-06: 2018-06-20 15:13:16.945104 read as UTC."""
    c = conv("timestamp", typmod, time_precision=mode)
    assert one(c, "2018-06-20 15:13:16.945104") == value
    assert c.connect_schema() == {"type": "int64", "optional": True, "name": name,
                                  "version": 1, "field": "c"}


def test_timestamp_infinity_and_pre_epoch():
    """TYPE-05: +-infinity -> 9223372036825200000 / -9223372036832400000."""
    c = conv("timestamp")
    assert one(c, "infinity") == 9223372036825200000
    assert one(c, "-infinity") == -9223372036832400000
    assert one(conv("timestamp", 3), "infinity") == 9223372036825200
    assert one(c, "1969-12-31 23:59:59.999999") == -1
    assert one(conv("timestamp", 3), "1969-12-31 23:59:59.999") == -1
    assert one(c, "0001-01-01 00:00:00 BC") == -62167219200000000  # 1 BC = year 0
    silver = conv("timestamp").to_silver(pa.array(["infinity", "-infinity"]))
    assert [str(v) for v in silver.to_pylist()] == [
        "9999-12-31 23:59:59.999999", "0001-01-01 00:00:00"]


@pytest.mark.parametrize(("mode", "typmod", "kind", "name", "value"), [
    ("adaptive", -1, "int64", "io.debezium.time.MicroTime", 54796945104),
    ("adaptive_time_microseconds", -1, "int64", "io.debezium.time.MicroTime", 54796945104),
    ("connect", -1, "int32", "org.apache.kafka.connect.data.Time", 54796945),
    ("adaptive", 3, "int32", "io.debezium.time.Time", 54796945),
    ("adaptive_time_microseconds", 3, "int64", "io.debezium.time.MicroTime", 54796945000),
])
def test_time_seed_example(mode, typmod, kind, name, value):
    """TYPE-06: TIME 15:13:16.945104; TIME(3) is milliseconds under adaptive; D-24: INT32."""
    c = conv("time", typmod, time_precision=mode)
    text = "15:13:16.945" if typmod == 3 else "15:13:16.945104"
    assert one(c, text) == value
    assert (c.connect_schema()["type"], c.connect_schema()["name"]) == (kind, name)
    assert one(conv("time"), "24:00:00") == 86_400_000_000


def test_zoned_timestamp_fraction_width_and_specials():
    """TYPE-07: UTC, Z suffix, column precision digits; infinities kept as strings."""
    assert one(conv("timestamptz", 3), "2018-06-20 17:13:16.9+02") == "2018-06-20T15:13:16.900Z"
    assert one(conv("timestamptz", 0), "2018-06-20 17:13:16+02") == "2018-06-20T15:13:16Z"
    c = conv("timestamptz")
    assert one(c, "infinity") == "infinity" and one(c, "-infinity") == "-infinity"
    assert one(c, "0044-03-15 12:00:00+00 BC") == "-0043-03-15T12:00:00.000000Z"
    assert one(c, "12345-01-01 00:00:00+00") == "+12345-01-01T00:00:00.000000Z"
    assert one(c, "1900-01-01 00:00:00+00:53:28") == "1899-12-31T23:06:32.000000Z"
    assert c.connect_schema()["name"] == "io.debezium.time.ZonedTimestamp"


def test_zoned_time():
    c = conv("timetz")
    assert one(c, "15:13:16.945104+05:30") == "09:43:16.945104Z"
    assert one(c, "01:00:00-03") == "04:00:00Z"
    assert one(c, "23:30:00.5-01") == "00:30:00.5Z"
    assert one(c, "24:00:00+00") == "00:00:00Z"  # as the real Debezium 3.6 writes it
    assert one(c, "10:00:00+02", silver=True) == "08:00:00Z"  # silver = the UTC form
    assert c.connect_schema()["name"] == "io.debezium.time.ZonedTime"


def test_date_infinity():
    c = conv("date")
    assert one(c, "infinity") == -2147472692 and one(c, "-infinity") == -2147472691
    assert [str(v) for v in c.to_silver(pa.array(["infinity", "-infinity"])).to_pylist()] == [
        "9999-12-31", "0001-01-01"]


# --- interval (D-02) ---------------------------------------------------------------------

def test_interval_modes():
    """Seed example P1Y2M3DT4H5M6.78S; numeric uses 365.25/12 days per month."""
    text = "1 year 2 mons 3 days 04:05:06.78"
    assert one(conv("interval", interval="string"), text) == "P1Y2M3DT4H5M6.78S"
    assert one(conv("interval"), "1 mon") == int(365.25 / 12 * 86400 * 10**6)
    assert one(conv("interval"), "-00:00:01.5") == -1_500_000
    exact = {"months": 14, "days": 3, "microseconds": (4 * 3600 + 5 * 60 + 6) * 10**6 + 780000}
    assert one(conv("interval", interval="string"), text, silver=True) == exact
    # numeric mode: only Debezium's approximation exists in bronze, so silver has just that
    assert one(conv("interval"), text, silver=True) == {
        "months": 0, "days": 0, "microseconds": 37091106780000}
    assert conv("interval").connect_schema()["name"] == "io.debezium.time.MicroDuration"


# --- numeric extras, money --------------------------------------------------------------

def test_decimal_string_mode_is_plain():
    """As the real Debezium 3.6 writes it (BigDecimal.toPlainString: no exponent)."""
    c = conv("numeric", decimal="string")
    assert c.to_bronze(pa.array(["0.00000010", "12.50", "0.000001"])).to_pylist() == [
        "0.00000010", "12.50", "0.000001"]


def test_money_modes():
    """TYPE-24: precise -> Decimal(scale=money.fraction.digits)."""
    c = conv("money")
    assert one(c, "-$1,234.56") == (-123456).to_bytes(3, "big", signed=True)
    assert c.connect_schema()["parameters"] == {"scale": "2"}
    assert one(conv("money", decimal="double"), "$1,234.56") == 1234.56
    assert one(conv("money", decimal="string"), "$12,345,678.00") == "1.2345678E7"
    assert str(one(c, "$0.07", silver=True)) == "0.07"


# --- binary, bits (TYPE-10) ---------------------------------------------------------------

@pytest.mark.parametrize(("mode", "expected"), [
    ("bytes", b"\x01\x02\xff"),
    ("base64", base64.b64encode(b"\x01\x02\xff").decode()),
    ("base64-url-safe", base64.urlsafe_b64encode(b"\x01\x02\xff").decode()),
    ("hex", "0102ff"),
])
def test_bytea_modes(mode, expected):
    c = conv("bytea", binary=mode)
    assert one(c, "\\x0102ff") == expected
    assert one(c, "\\x0102ff", silver=True) == b"\x01\x02\xff"


def test_bits_little_endian():
    """Bits little-endian, sized by content (BIT(n) too, as the real Debezium 3.6 writes)."""
    assert one(conv("bit", 1), "1") is True
    bit10 = conv("bit", 10)
    assert one(bit10, "0000000101") == b"\x05"
    assert one(bit10, "1000000000") == b"\x00\x02"
    assert one(bit10, "0000000101", silver=True) == "0000000101"
    assert bit10.connect_schema()["parameters"] == {"length": "10"}
    assert bit10.connect_schema()["name"] == "io.debezium.data.Bits"
    varbit = conv("varbit")
    assert one(varbit, "101") == b"\x05"
    assert varbit.connect_schema()["parameters"] == {"length": str(2**31 - 1)}
    assert one(conv("varbit", 1), "0") is False


# --- strings with semantic names ---------------------------------------------------------

@pytest.mark.parametrize(("name", "semantic"), [
    ("json", "io.debezium.data.Json"), ("jsonb", "io.debezium.data.Json"),
    ("xml", "io.debezium.data.Xml"), ("uuid", "io.debezium.data.Uuid"),
    ("text", None), ("inet", None), ("cidr", None), ("macaddr", None), ("macaddr8", None),
    ("int4range", None), ("tstzrange", None), ("daterange", None), ("bpchar", None),
])
def test_string_types(name, semantic):
    c = conv(name)
    assert c.connect_schema().get("name") == semantic
    assert one(c, "x") == "x"


def test_extension_types_enum_domain():
    modes = TypeModes()
    for ext, semantic in (("citext", None), ("ltree", "io.debezium.data.Ltree")):
        c = converter_for("c", pg(ext, schema="public"), -1, modes)
        assert c.connect_schema().get("name") == semantic
    mood = pg("mood", schema="public", typtype="e", enum_labels=("sad", "ok", "happy"))
    c = converter_for("c", mood, -1, modes)
    assert c.connect_schema()["parameters"] == {"allowed": "sad,ok,happy"}
    assert c.connect_schema()["name"] == "io.debezium.data.Enum"
    dom = pg("price", schema="public", typtype="d", base=pg("numeric"),
             base_typmod=(10 << 16 | 2) + 4)
    assert converter_for("c", dom, -1, modes).connect_schema()["parameters"]["scale"] == "2"


def test_hstore_modes():
    """TYPE-09 / D-20: json mode {"key":"val"}; map mode MAP."""
    c = converter_for("c", pg("hstore", schema="public"), -1, TypeModes())
    assert one(c, '"key"=>"val"') == '{"key":"val"}'
    assert one(c, '"a"=>NULL') == '{"a":null}'
    m = converter_for("c", pg("hstore", schema="public"), -1, TypeModes(hstore="map"))
    assert one(m, '"key"=>"val", "k2"=>NULL') == [("key", "val"), ("k2", None)]
    assert m.connect_schema()["type"] == "map"
    assert m.to_json([("key", "val")]) == {"key": "val"}


def test_hstore_json_key_order_is_java_hashmap_order():
    from pgcdc_dagster.cdc.typeconv.hstore import java_hashmap_order, java_string_hash

    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert java_hashmap_order(["b", "a", "c"]) == ["a", "b", "c"]


# --- geometric (TYPE-01) -------------------------------------------------------------------

def test_point():
    c = conv("point")
    v = one(c, "(1.5,-2)")
    assert (v["x"], v["y"], v["srid"]) == (1.5, -2.0, None)
    assert v["wkb"] == bytes.fromhex("0101000000000000000000f83f00000000000000c0")
    assert c.connect_schema()["name"] == "io.debezium.data.geometry.Point"
    assert one(c, "(1.5,-2)", silver=True) == {"x": 1.5, "y": -2.0}


def test_postgis_ewkb_with_srid():
    # SELECT 'SRID=4326;POINT(1 2)'::geometry  -> hex EWKB
    ewkb = "0101000020E6100000000000000000F03F0000000000000040"
    for name in ("geometry", "geography"):
        c = converter_for("c", pg(name, schema="public"), -1, TypeModes())
        assert one(c, ewkb) == {"wkb": bytes.fromhex(ewkb), "srid": 4326}
        assert c.connect_schema()["name"].endswith(name.capitalize())
    plain = "0101000000000000000000F03F0000000000000040"
    c = converter_for("c", pg("geometry", schema="public"), -1, TypeModes())
    assert one(c, plain)["srid"] is None  # parseSrid: no SRID flag -> null
    silver = c.to_silver(pa.array([plain, None], pa.string())).to_pylist()
    assert silver[0]["srid"] == 0 and silver[1] is None  # silver: ST_SRID's 0


# --- arrays (TYPE-25), placeholders (TYPE-17/18), unknown types (TYPE-12) -----------------

def test_arrays_with_nulls_empty_and_quotes():
    c = converter_for("c", array_of(pg("text")), -1, TypeModes())
    out = c.to_bronze(pa.array(['{a,NULL,"b c","NULL","q\\"x"}', "{}", None]))
    assert out.to_pylist() == [["a", None, "b c", "NULL", 'q"x'], [], None]
    assert c.connect_schema()["items"] == {"type": "string", "optional": True}
    dec = converter_for("c", array_of(pg("numeric")), (5 << 16 | 2) + 4, TypeModes())
    assert dec.to_bronze(pa.array(["{1.00,-1.00}"])).to_pylist() == [[b"\x64", b"\x9c"]]
    two = converter_for("c", array_of(pg("int4")), -1, TypeModes(), dimensions=2)
    assert two.to_silver(pa.array(["{{1,2},{3,NULL}}", "{5}"])).to_pylist() == [
        [[1, 2], [3, None]], [[5]]]


def test_toast_placeholders():
    modes = TypeModes()
    p = "__debezium_unavailable_value"
    assert conv("text").bronze_placeholder().as_py() == p
    assert conv("bytea").bronze_placeholder().as_py() == p.encode()
    assert conv("bytea", binary="hex").bronze_placeholder().as_py() == p
    assert conv("int4").bronze_placeholder() is None
    assert converter_for("c", array_of(pg("text")), -1, modes).bronze_placeholder().as_py() == [p]
    ints = converter_for("c", array_of(pg("int8")), -1, modes).bronze_placeholder().as_py()
    assert ints == list(p.encode())
    hexmodes = TypeModes(unavailable_placeholder="hex:00ff")
    assert converter_for("c", pg("bytea"), -1, hexmodes).bronze_placeholder().as_py() == b"\0\xff"


def test_unknown_types_dropped_or_opaque():
    box = pg("box")
    dropped = converter_for("c", box, -1, TypeModes())
    assert dropped.dropped is True
    opaque = converter_for("c", box, -1, TypeModes(include_unknown=True))
    assert opaque.dropped is False
    assert one(opaque, "(1,1),(0,0)") == b"(1,1),(0,0)"
    assert converter_for("c", array_of(box), -1, TypeModes()).dropped is True


def test_modes_are_validated():
    with pytest.raises(ConfigurationError, match=r"time\.precision\.mode"):
        TypeModes(time_precision="nanos")
    with pytest.raises(ConfigurationError, match=r"binary\.handling\.mode"):
        TypeModes(binary="raw")


def test_not_null_column_gets_debezium_fallback():
    c = converter_for("c", pg("int4"), -1, TypeModes(), nullable=False)
    assert c.to_bronze(pa.array([None, "3"], pa.string())).to_pylist() == [0, 3]
    assert c.connect_schema()["optional"] is False
    assert c.bronze_field.nullable is False


def test_json_export_values():
    c = conv("float8")
    assert c.to_json(float("nan")) == "NaN" and c.to_json(float("-inf")) == "-Infinity"
    n = conv("numeric")
    assert n.to_json({"scale": 2, "value": b"\x04\xd2"}) == {"scale": 2, "value": "BNI="}
    meta = n.bronze_field.metadata
    assert meta[b"debezium.name"] == b"io.debezium.data.VariableScaleDecimal"
    assert meta[b"pg.type"] == b"pg_catalog.numeric"


@pytest.mark.parametrize(("name", "typmod", "modes", "values"), [
    ("numeric", -1, {}, ["12.3400", "100", "-0.000001", None]),
    ("numeric", -1, {"decimal": "string"}, ["0.00000010", "NaN", "Infinity", None]),
    ("numeric", -1, {"decimal": "double"}, ["1.5", "NaN", None]),
    ("numeric", (5 << 16 | 2) + 4, {"decimal": "double"}, ["1.5", "-999.99", "NaN", None]),
    ("numeric", (50 << 16 | 3) + 4, {}, ["1.500", "-12345678901234567890123456789012345.000"]),
    ("money", -1, {"decimal": "string"}, ["$1,234.56", "-$0.01", None]),
    ("timestamp", 3, {"time_precision": "connect"}, ["2018-06-20 15:13:16.945", "infinity"]),
    ("timestamptz", -1, {}, ["2018-06-20 15:13:16.945104+02", "infinity", "12345-01-01 "
                             "00:00:00+00", "0044-03-15 12:00:00+00 BC", None]),
    ("date", -1, {}, ["2018-06-20", "infinity", "-infinity", None]),
    ("time", 3, {}, ["15:13:16.945", "24:00:00", None]),
    ("interval", -1, {"interval": "string"}, ["-1 days -00:00:01.5", None]),
    ("bytea", -1, {"binary": "base64-url-safe"}, ["\\xfbff", None]),
    ("bit", 10, {}, ["0000000101", None]),
    ("varbit", -1, {}, ["00101", ""]),
    ("point", -1, {}, ["(1,2)", None]),
])
def test_silver_is_decoded_bronze(name, typmod, modes, values):
    """to_silver(text) == from_bronze(to_bronze(text)): snapshot and stream silver agree."""
    c = conv(name, typmod, **modes)
    text = pa.array(values, type=pa.string())
    assert c.to_silver(text).equals(c.from_bronze(c.to_bronze(text)))


def test_from_bronze_accepts_slices_and_chunks():
    arr = converter_for("c", array_of(pg("numeric")), (5 << 16 | 2) + 4, TypeModes())
    text = pa.array(["{1.00,NULL}", None, "{}", "{-2.50}"], type=pa.string())
    bronze = arr.to_bronze(text)
    assert arr.from_bronze(bronze.slice(1)).equals(arr.to_silver(text.slice(1)))
    chunked = pa.chunked_array([bronze.slice(0, 2), bronze.slice(2)])
    assert arr.from_bronze(chunked).equals(arr.to_silver(text))
    dec = conv("numeric", (10 << 16 | 2) + 4)
    values = dec.to_bronze(pa.array(["1.00", None, "-3.21"]))
    assert dec.from_bronze(values.slice(1)).to_pylist() == [None, dec.to_silver(
        pa.array(["-3.21"])).to_pylist()[0]]
