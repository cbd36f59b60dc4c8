"""Scalar types against a real PostgreSQL: edge values -> text output -> bronze equals the seed
rules, silver equals the PostgreSQL value (psycopg2's value or a SQL-side rendering).

IDs: seed-inventory.md TYPE-*, CFG-*.
"""

from __future__ import annotations

import json
import math
from decimal import Context, Decimal

import pytest

from pgcdc_dagster.cdc.typeconv import TypeModes
from pgcdc_dagster.exceptions import UnsupportedTypeError
from tests.integration.test_types_support import UNREPRESENTABLE, make_case

pytestmark = pytest.mark.integration
WIDE = Context(prec=1000)


@pytest.fixture
def conn(pg_conn):
    with pg_conn.cursor() as cur:
        cur.execute("SET TimeZone = 'Asia/Kolkata'")  # +05:30, so offsets really get applied
    return pg_conn


@pytest.mark.parametrize(("ddl", "literals"), [
    ("boolean", ["true", "false", "NULL"]),
    ("smallint", ["-32768", "32767", "0", "NULL"]),
    ("integer", ["-2147483648", "2147483647", "-1", "NULL"]),
    ("bigint", ["-9223372036854775808", "9223372036854775807", "NULL"]),
    ("oid", ["0", "4294967295", "NULL"]),
    ("smallserial", ["1"]),
])
def test_bool_and_integers(conn, ddl, literals):
    case = make_case(conn, ddl, literals)
    assert case.bronze() == case.py
    assert case.silver() == case.py


@pytest.mark.parametrize("ddl", ["real", "double precision"])
def test_floats_with_special_values(conn, ddl):
    lits = ["'NaN'", "'Infinity'", "'-Infinity'", "1.5", "'-0'", "1e-30", "3.4e38", "NULL"]
    case = make_case(conn, ddl, lits)
    for got, want in zip(case.bronze(), case.py, strict=True):
        if want is None or math.isnan(want):
            assert got is None if want is None else math.isnan(got)
        else:
            assert got == pytest.approx(want, rel=1e-7 if ddl == "real" else 0)
            assert math.copysign(1, got) == math.copysign(1, want)
    assert case.conv.to_json(case.bronze()[0]) == "NaN"


@pytest.mark.parametrize("ddl", ["text", "varchar(20)", "char(6)", "character varying", "name"])
def test_character_types(conn, ddl):
    lits = ["'日本語 ✓'", "''", "E'tab\\there\\nline\\\\back'", "'a,b{c}\"'", "NULL"]
    if ddl == "char(6)":
        lits = ["'日本'", "''", "'ab'", "NULL"]
    case = make_case(conn, ddl, lits)
    assert case.bronze() == case.py  # char(n) keeps its padding, like PostgreSQL's output
    assert case.silver() == case.py
    assert case.conv.connect_schema() == {"type": "string", "optional": True, "field": "c"}


def test_numeric_precise_decimal(conn):
    """Decimal bytes = unscaled big-endian two's complement; scale/precision parameters."""
    lits = ["0", "-0.01", "99999999.99", "-99999999.99", "1.28", "-1.28", "NULL"]
    case = make_case(conn, "numeric(10,2)", lits)
    unscaled = case.sql("(c * 100)::bigint")
    assert [None if b is None else int.from_bytes(b, "big", signed=True)
            for b in case.bronze()] == unscaled
    assert case.bronze()[5] == b"\x80" and case.bronze()[4] == b"\x00\x80"
    assert case.conv.connect_schema()["parameters"] == {
        "scale": "2", "connect.decimal.precision": "10"}
    assert case.silver() == case.py


@pytest.mark.parametrize(("ddl", "lits"), [
    ("numeric(38,10)", ["'9999999999999999999999999999.9999999999'", "'-0.0000000001'"]),
    ("numeric(60,20)", ["'1234567890123456789012345678901234567890.12345678901234567890'"]),
    ("numeric(100,0)", ["'-" + "9" * 100 + "'", "0"]),
    ("numeric(5,-2)", ["12345", "-99900"]),
])
def test_numeric_precision_limits(conn, ddl, lits):
    case = make_case(conn, ddl, [*lits, "NULL"])
    scale = int(case.conv.connect_schema()["parameters"]["scale"])
    decoded = [None if b is None
               else Decimal(int.from_bytes(b, "big", signed=True)).scaleb(-scale, WIDE)
               for b in case.bronze()]
    assert decoded == case.py
    silver = case.silver()
    assert [None if v is None else Decimal(v) for v in silver] == case.py


def test_numeric_unconstrained_variable_scale(conn):
    lits = ["0", "'12.3400'", "100", "'-0.000000001'", "'1e100'",
            "'123456789012345678901234567890123456789012345.678'", "NULL"]
    case = make_case(conn, "numeric", lits)
    decoded = [None if v is None else
               Decimal(int.from_bytes(v["value"], "big", signed=True)).scaleb(-v["scale"], WIDE)
               for v in case.bronze()]
    assert decoded == case.py
    assert case.bronze()[1]["scale"] == 2 and case.bronze()[2]["scale"] == 0
    assert case.conv.connect_schema()["name"] == "io.debezium.data.VariableScaleDecimal"
    assert [None if v is None else Decimal(v) for v in case.silver()] == case.py


def test_numeric_special_values_per_mode(conn):
    """TYPE-08: NaN and infinities in double and string modes; precise rejects them."""
    lits = ["'NaN'", "'Infinity'", "'-Infinity'", "'1.5'", "'0.00000010'", "NULL"]
    for ddl in ("numeric", "numeric(12,8)"):
        lits_ = lits if ddl == "numeric" else ["'NaN'", "'1.5'", "'0.00000010'", "NULL"]
        s = make_case(conn, ddl, lits_, TypeModes(decimal="string"))
        d = make_case(conn, ddl, lits_, TypeModes(decimal="double"))
        strings = s.bronze()
        assert strings[0] == "NAN"
        if ddl == "numeric":
            assert strings[1:3] == ["POSITIVE_INFINITY", "NEGATIVE_INFINITY"]
            assert strings[4] == "0.00000010"  # plain, as Debezium 3.6
        else:
            assert strings[1:3] == ["1.50000000", "0.00000010"]
        doubles = d.bronze()
        assert math.isnan(doubles[0]) and doubles[-1] is None
        assert [float(v) if v is not None else None for v in d.py][1:] == doubles[1:]
        with pytest.raises(UnsupportedTypeError, match=r"decimal\.handling\.mode"):
            make_case(conn, ddl, lits_).bronze()
        silver = s.silver()
        assert silver[0] == ("NaN" if ddl == "numeric" else None)  # decimal silver: NULL


def test_money(conn):
    lits = ["'1234.56'", "'-92233720368547758.08'", "'92233720368547758.07'", "0", "NULL"]
    case = make_case(conn, "money", lits)
    exact = case.sql("(c::numeric * 100)::bigint")
    assert [None if b is None else int.from_bytes(b, "big", signed=True)
            for b in case.bronze()] == exact
    assert case.silver() == case.sql("c::numeric")
    dbl = make_case(conn, "money", lits, TypeModes(decimal="double")).bronze()
    assert dbl[0] == 1234.56 and dbl[3] == 0.0
    strings = make_case(conn, "money", lits, TypeModes(decimal="string")).bronze()
    assert strings[0] == "1234.56" and strings[3] == "0.0"


def test_timestamptz(conn):
    """ZonedTimestamp: the instant in UTC, Z, column precision digits (TYPE-07)."""
    lits = ["'2018-06-20 15:13:16.945104+00'", "'2018-06-20 15:13:16+05:30'",
            "'1970-01-01 00:00:00+00'", "'1900-01-01 00:00:00+00'", "'0044-03-15 12:00:00+00 BC'",
            "'12345-06-01 00:00:00+00'", "'infinity'", "'-infinity'", "NULL"]
    case = make_case(conn, "timestamptz", lits)
    expected = case.sql("""CASE WHEN isfinite(c) THEN
        to_char(c AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') ELSE c::text END""")
    got = case.bronze()
    assert got[:4] == expected[:4]
    assert got[4] == "-0043-03-15T12:00:00.000000Z"  # 44 BC, java.time proleptic year
    assert got[5] == "+12345-06-01T00:00:00.000000Z"
    assert got[6:] == ["infinity", "-infinity", None]
    silver = case.silver()
    assert silver[:4] == case.py[:4]
    # outside the Delta/Spark range (BC, years past 9999, infinities): clamped
    assert [str(v) for v in silver[4:8]] == [
        "0001-01-01 00:00:00+00:00", "9999-12-31 23:59:59.999999+00:00",
        "9999-12-31 23:59:59.999999+00:00", "0001-01-01 00:00:00+00:00"]
    for p in (0, 3):
        c3 = make_case(conn, f"timestamptz({p})", ["'2018-06-20 15:13:16.945104+00'"])
        # PostgreSQL rounds to the column precision on input
        assert c3.bronze() == ["2018-06-20T15:13:17Z" if p == 0 else "2018-06-20T15:13:16.945Z"]
    # QA: PostgreSQL's last instants lie past 2^63 microseconds after 1970 (crashed the
    # snapshot with an OverflowError): java.time's text, exact; silver clamped.
    last = make_case(conn, "timestamptz", ["'294276-12-31 23:59:59.999999+00'",
                                           "'294247-01-10 04:00:54.775808+00'"])
    assert last.bronze() == ["+294276-12-31T23:59:59.999999Z", "+294247-01-10T04:00:54.775808Z"]
    assert [str(v) for v in last.silver()] == ["9999-12-31 23:59:59.999999+00:00"] * 2


@pytest.mark.parametrize("mode", ["adaptive", "adaptive_time_microseconds", "connect"])
@pytest.mark.parametrize("ddl", ["timestamp", "timestamp(3)", "timestamp(6)", "timestamp(0)"])
def test_timestamp(conn, mode, ddl):
    lits = ["'2018-06-20 15:13:16.945104'", "'1969-12-31 23:59:59.999'", "'0001-01-01 00:00:00'",
            "'0044-03-15 12:00:00 BC'", "'9999-12-31 23:59:59.999999'", "NULL"]
    case = make_case(conn, ddl, lits, TypeModes(time_precision=mode))
    micros = case.sql("(extract(epoch from c) * 1000000)::numeric")
    millis = mode == "connect" or ddl in ("timestamp(3)", "timestamp(0)")
    want = [None if m is None else (int(m // 1000) if millis else int(m)) for m in micros]
    assert case.bronze() == want  # TYPE-04: read as UTC
    silver = case.silver()
    py = case.py
    if mode == "connect":  # milliseconds in bronze, so in silver too
        py = [v if v in (None, UNREPRESENTABLE) else v.replace(microsecond=v.microsecond
                                                             // 1000 * 1000) for v in py]
    assert silver[:3] == py[:3] and silver[5] is None
    assert str(silver[3]) == "0001-01-01 00:00:00"  # BC: clamped to the Delta range
    if py[4] is not UNREPRESENTABLE:  # timestamp(0)/(3) round 23:59:59.999999 up
        assert silver[4] == py[4]
    else:
        assert str(silver[4]) == "9999-12-31 23:59:59.999999"
    inf = make_case(conn, ddl, ["'infinity'", "'-infinity'"], TypeModes(time_precision=mode))
    scale = 1000 if millis else 1
    assert inf.bronze() == [9223372036825200000 // scale, -9223372036832400000 // scale]
    # QA: past 2^63 microseconds after 1970 (PostgreSQL goes to 294276 AD): saturated at the
    # int64 maximum, as Debezium's TimeUnit conversion saturates (an OverflowError before)
    last = make_case(conn, ddl, ["'294276-12-31 23:59:59'", "'294247-01-10 04:00:54'"],
                     TypeModes(time_precision=mode))
    assert last.bronze() == [(2**63 - 1) // scale, 9223372036854000000 // scale]
    assert [str(v) for v in last.silver()] == ["9999-12-31 23:59:59.999999"] * 2


@pytest.mark.parametrize("mode", ["adaptive", "adaptive_time_microseconds", "connect"])
def test_date(conn, mode):
    lits = ["'2018-06-20'", "'1970-01-01'", "'1969-12-31'", "'0001-01-01'", "'0044-03-15 BC'",
            "'9999-12-31'", "'5874897-12-31'", "NULL"]
    case = make_case(conn, "date", lits, TypeModes(time_precision=mode))
    assert case.bronze() == case.sql("c - date '1970-01-01'")
    assert case.bronze()[0] == 17702  # TYPE-06
    silver = case.silver()
    assert silver[:4] == case.py[:4] and silver[5] == case.py[5]


@pytest.mark.parametrize("mode", ["adaptive", "adaptive_time_microseconds", "connect"])
@pytest.mark.parametrize("ddl", ["time", "time(3)", "time(6)", "time(0)"])
def test_time(conn, mode, ddl):
    lits = ["'15:13:16.945104'", "'00:00:00'", "'23:59:59.999999'", "'24:00:00'", "NULL"]
    case = make_case(conn, ddl, lits, TypeModes(time_precision=mode))
    micros = case.sql("(extract(epoch from c) * 1000000)::bigint")
    p = int(ddl[5]) if "(" in ddl else 6
    ms = mode == "connect" or (mode == "adaptive" and p <= 3)
    assert case.bronze() == [None if m is None else (m // 1000 if ms else m) for m in micros]
    # silver: ISO text with exactly P fraction digits (Delta has no TIME type)
    want = []
    for text in case.texts:
        if text is None:
            want.append(None)
            continue
        whole, _, frac = text.partition(".")
        frac = frac.ljust(6, "0")
        if mode == "connect":
            frac = frac[:3] + "000"
        want.append(whole + ("." + frac[:p] if p else ""))
    assert case.silver() == want
    assert case.silver()[3].startswith("24:00:00")


def test_timetz(conn):
    lits = ["'15:13:16.945104+05:30'", "'01:00:00-03'", "'23:30:00.5-01'", "'00:00:00+00'",
            "'24:00:00+00'", "NULL"]
    case = make_case(conn, "timetz", lits)
    utc = case.sql("(c AT TIME ZONE 'UTC')::text")
    assert case.bronze()[:4] == [u.replace("+00", "Z") for u in utc[:4]]
    assert case.bronze()[4:] == ["00:00:00Z", None]  # as Debezium 3.6 writes it
    assert case.silver() == case.bronze()  # silver: the same UTC form


@pytest.mark.parametrize("mode", ["numeric", "string"])
def test_interval(conn, mode):
    lits = ["'1 year 2 months 3 days 04:05:06.78'", "'-1 day -00:00:01.5'", "'0'", "'1 mon'",
            "'-178000000 years'", "'100 hours'", "'1 day -1 second'", "NULL"]
    case = make_case(conn, "interval", lits, TypeModes(interval=mode))
    parts = case.sql("CASE WHEN c IS NOT NULL THEN"
                     " ARRAY[extract(year from c), extract(month from c), extract(day from c),"
                     " extract(hour from c), extract(minute from c), extract(second from c)] END")
    want = []
    for p in parts:
        if p is None:
            want.append(None)
            continue
        y, mo, d, h, mi, s = (int(p[0]), int(p[1]), int(p[2]), int(p[3]), int(p[4]), p[5])
        if mode == "string":
            secs = format(s.normalize(), "f") if s else "0"
            want.append(f"P{y}Y{mo}M{d}DT{h}H{mi}M{secs}S")
        else:
            # a 365.25/12-day month is 2,629,800 s: the sum is exact in integers
            micros = ((y * 12 + mo) * 2_629_800_000_000 + d * 86_400_000_000
                      + ((h * 60 + mi) * 60) * 1_000_000 + int(s * 1_000_000))
            want.append(max(min(micros, 2**63 - 1), -(2**63)))  # Java (long) saturates
    assert case.bronze() == want
    if mode == "string":
        assert case.bronze()[0] == "P1Y2M3DT4H5M6.78S"  # the seed's example
    exact = case.sql("""CASE WHEN c IS NULL THEN NULL ELSE json_build_object(
        'months', (extract(year from c) * 12 + extract(month from c))::int,
        'days', extract(day from c)::int,
        'microseconds', ((extract(hour from c) * 3600 + extract(minute from c) * 60
                         + extract(second from c)) * 1000000)::bigint) END""")
    if mode == "string":
        assert case.silver() == exact
    else:  # numeric: bronze holds only Debezium's approximation, and silver decodes bronze
        assert case.silver() == [None if b is None else
                                 {"months": 0, "days": 0, "microseconds": b}
                                 for b in case.bronze()]


def test_bytea_modes_and_escape_output(conn):
    lits = ["'\\x'::bytea", "'\\x00ff'::bytea", "decode(repeat('ab', 3), 'hex')",
            "(SELECT string_agg(set_byte('\\x00'::bytea, 0, i), ''::bytea) "
            "FROM generate_series(0, 255) i)", "NULL"]
    for mode in ("bytes", "base64", "base64-url-safe", "hex"):
        case = make_case(conn, "bytea", lits, TypeModes(binary=mode))
        raw = [None if v is None else bytes(v) for v in case.py]
        assert case.silver() == raw
        import base64
        enc = {"bytes": lambda b: b, "base64": lambda b: base64.b64encode(b).decode(),
               "base64-url-safe": lambda b: base64.urlsafe_b64encode(b).decode(),
               "hex": lambda b: b.hex()}[mode]
        assert case.bronze() == [None if b is None else enc(b) for b in raw]
    with conn.cursor() as cur:
        cur.execute("SET bytea_output = 'escape'")
    escaped = make_case(conn, "bytea", lits)
    assert escaped.texts[1] != "\\x00ff"
    assert escaped.silver() == [None if v is None else bytes(v) for v in escaped.py]


def test_bits(conn):
    """Bits: little-endian, sized by content (BIT(n) too, as Debezium 3.6); BIT(1) boolean."""
    b1 = make_case(conn, "bit(1)", ["B'1'", "B'0'", "NULL"])
    assert b1.bronze() == [True, False, None]
    b10 = make_case(conn, "bit(10)", ["B'0000000101'", "B'1000000000'", "B'0000000000'"])
    assert b10.bronze() == [b"\x05", b"\x00\x02", b""]
    assert b10.silver() == b10.texts
    vb = make_case(conn, "varbit", ["B'101'", "B''", "B'1" + "0" * 16 + "'"])
    assert vb.bronze() == [b"\x05", b"", b"\x00\x00\x01"]
    assert vb.conv.connect_schema()["parameters"] == {"length": "2147483647"}
    vb5 = make_case(conn, "bit varying(5)", ["B'11'"])
    assert vb5.bronze() == [b"\x03"] and vb5.conv.connect_schema()["parameters"]["length"] == "5"


@pytest.mark.parametrize(("ddl", "lits", "semantic"), [
    ("json", ["'{\"a\": [1, 2.5, null], \"é\": \"x\"}'", "'[]'", "'\"s\"'", "'null'"],
     "io.debezium.data.Json"),
    ("jsonb", ["'{\"b\": 1, \"a\": {\"c\": true}}'", "'3.14'"], "io.debezium.data.Json"),
    ("xml", ["'<a x=\"1\">ü</a>'", "'<!-- c --><b/>'"], "io.debezium.data.Xml"),
    ("uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'"],
     "io.debezium.data.Uuid"),
    ("inet", ["'192.168.1.5'", "'10.0.0.0/8'", "'::1'", "'2001:db8::1/64'"], None),
    ("cidr", ["'10.0.0.0/8'", "'2001:db8::/32'"], None),
    ("macaddr", ["'08:00:2b:01:02:03'"], None),
    ("macaddr8", ["'08:00:2b:01:02:03:04:05'"], None),
    ("int4range", ["'[1,5)'", "'empty'", "'(,)'", "'[3,3]'"], None),
    ("int8range", ["'[-9223372036854775808,0)'"], None),
    ("numrange", ["'(1.5,2.25]'"], None),
    ("tsrange", ["'[2018-06-20 15:13:16,2018-06-21 00:00:00)'"], None),
    ("tstzrange", ["'[2018-06-20 15:13:16+00,infinity)'"], None),
    ("daterange", ["'[2018-06-20,2018-06-22]'"], None),
])
def test_string_types(conn, ddl, lits, semantic):
    case = make_case(conn, ddl, [*lits, "NULL"])
    assert case.bronze() == case.texts
    assert case.silver() == case.texts
    assert case.conv.connect_schema().get("name") == semantic
    if ddl in ("json", "jsonb"):
        assert [None if v is None else json.loads(v) for v in case.silver()] == case.py
    elif ddl not in ("int4range", "int8range", "numrange", "tsrange", "tstzrange", "daterange"):
        assert case.silver() == [None if v is None else str(v) for v in case.py]
    if ddl == "daterange":
        assert case.bronze()[0] == "[2018-06-20,2018-06-23)"  # always exclusive upper bound


def test_point(conn):
    case = make_case(conn, "point", ["'(1.5,-2)'", "'(0,0)'", "'(1e300,-1e-300)'", "NULL"])
    xy = case.sql("CASE WHEN c IS NULL THEN NULL ELSE ARRAY[c[0], c[1]] END")
    got = case.bronze()
    assert [None if v is None else [v["x"], v["y"]] for v in got] == xy
    assert got[0]["wkb"] == bytes.fromhex("0101000000000000000000f83f00000000000000c0")
    assert [None if v is None else [v["x"], v["y"]] for v in case.silver()] == xy
