"""The same changes through pgoutput, wal2json and decoderbufs (STR-32..35).

Three slots created one after the other on the same database, each with its own lakehouse,
then one workload: every slot decodes the same transactions. The streamed bronze events
must be equal across the plugins, value by value, except what a plugin cannot carry (the
seeds' "differences between plug-ins", docs/plugins.md), which is asserted as such:

- wal2json writes NaN and +/-Infinity of ``real`` / ``double precision`` / ``numeric`` as
  JSON null (STR-35);
- decoderbufs sends no TRUNCATE (and no logical decoding message);
- decoderbufs sends no commit LSN: ``__commit_lsn`` is a position inside the commit record
  (still in commit order), so only the change LSNs are compared for it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.typeconv import TypeModes
from pgcdc_dagster.lake.paths import table_uri

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PLUGINS = ("pgoutput", "wal2json", "decoderbufs")
COLUMNS = (
    "s int2, i int4, b int8, r real, d double precision, n numeric(12,3), nv numeric, "
    "t bool, tx text, vc varchar(20), ch char(4), by bytea, dt date, tm time, tm3 time(3), "
    "ttz timetz, ts timestamp, ts3 timestamp(3), tstz timestamptz, iv interval, js json, "
    "jb jsonb, u uuid, m money, p point, ia int[], ta text[], ip inet, bt bit(5), "
    "vb varbit, x xml, big text")
ROWS = [
    "(-2, 3, 40000000000, 1.5, -2.25, 12.345, 1.5e-7, true, 'a''b\"c', 'x', 'ab', "
    "'\\x00ff', '2024-02-29', '13:51:30', '13:51:30.123', '23:30:00-05', "
    "'2016-11-04 13:51:30.123456', '2016-11-04 13:51:30.5', '2016-11-04 13:51:30.123456+02', "
    "'1 year 2 mons 3 days 04:05:06.78', '{\"k\": [1, 2]}', '{\"k\": 1}', "
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '-1234.56', '(1.5,-2)', '{1,NULL,3}', "
    "'{\"a b\",NULL}', '192.168.0.1/24', B'10101', B'1101', '<a>1</a>', repeat('z', 5000))",
    "(NULL, NULL, NULL, 'NaN', 'Infinity', 'NaN', 'NaN', false, '', NULL, NULL, NULL, "
    "'0044-03-15 BC', '00:00:00', NULL, '00:00:00+00', '1999-12-31 23:59:59', NULL, "
    "'2000-01-01 00:00:00+00', '-3 days', 'null', '[]', NULL, '0', NULL, '{}', '{}', NULL, "
    "B'00000', B'', NULL, NULL)",
    "(7, 7, 7, '-Infinity', 1e300, 0, 'Infinity', NULL, 'ü', 'ü', 'ü', '\\x', "
    "'9999-12-31', '23:59:59.999999', '12:00:00.001', '12:00:00+14', "
    "'1970-01-01 00:00:00', '1970-01-01 00:00:00.001', '1970-01-01 00:00:00+00', "
    "'00:00:00.000001', '1', '1', '00000000-0000-0000-0000-000000000000', '1000000', "
    "'(0,0)', '{-1}', '{\"\"}', '::1', B'11111', B'1', '', '')",
    # exactness: numbers past 2^53 and 40 digits, floats that round, -0, escapes in text,
    # arrays and JSON (wal2json writes numbers bare and strings escaped)
    "(32767, -2147483648, 9007199254740993, '-0', 0.1, 123456789.1, "
    "1234567890123456789012345678901234567890.0123456789, true, "
    "E'tab\\t \"q\" back\\\\slash \\u0001 nl\\n é 😀 \\u2028', 'ü\"\\\\', 'a\\b', "
    "'\\xdeadbeef', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "E'{\"s\": \"\\\\u00e9\\\\n\", \"n\": 1.0000000000000000001, "
    "\"big\": 12345678901234567890}', '{\"n\": 1.10, \"a\": [1e308, -0.0, 0.1]}', "
    "NULL, NULL, NULL, '{2147483647,-2147483648}', E'{\"q\\\\\"uote\",\"b\\\\\\\\s\",é}', "
    "NULL, NULL, NULL, NULL, NULL)",
    "(-32768, 2147483647, -9223372036854775808, 3.4028235e38, 1e308, -999999999.999, "
    "'-0.0000000000000000000000000000000000000001', false, E'\\\\', '', '', '\\x00', "
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '\"\"', '\"\\\\u0000x\"', NULL, "
    "NULL, NULL, '{}', '{NULL}', NULL, NULL, NULL, NULL, NULL)",
]


def _workload(conn) -> None:
    with conn.cursor() as cur:
        for i, row in enumerate(ROWS):
            cur.execute(f"INSERT INTO kinds VALUES {row}".replace("(", f"({i + 1}, ", 1))
        cur.execute("UPDATE kinds SET i = 99 WHERE id = 1")  # big stays unchanged TOAST
        cur.execute("UPDATE kinds SET id = 10 WHERE id = 2")  # key change
        cur.execute("DELETE FROM kinds WHERE id = 3")
        cur.execute("TRUNCATE kinds")
        cur.execute(f"INSERT INTO kinds VALUES {ROWS[0]}".replace("(", "(5, ", 1))


def _events(lakehouse) -> list[dict[str, Any]]:
    rows = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "kinds")) \
        .to_pyarrow_table().to_pylist()
    return sorted((r for r in rows if r["op"] != "r"),
                  key=lambda r: (r["__commit_lsn"], r["__ordinal"], r["op"] != "d"))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return repr(a) == repr(b)  # NaN equals NaN; -0.0 differs from 0.0
    return bool(a == b)


def _non_finite(value: Any) -> bool:
    """NaN / Infinity as bronze holds them (floats; decimal.handling.mode=string names)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    return value in ("NAN", "POSITIVE_INFINITY", "NEGATIVE_INFINITY")


def test_plugins_give_the_same_bronze(pg_dsn, pg_conn, spark, tmp_path):
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE kinds (id int PRIMARY KEY, {COLUMNS})")
    settings = {p: CaptureSettings(dsn=pg_dsn, lakehouse=str(tmp_path / p),
                                   include=("public\\.kinds",), slot=f"diff_{p}",
                                   publication="diff", plugin_name=p,
                                   modes=TypeModes(decimal="string")) for p in PLUGINS}
    for s in settings.values():  # one slot each, all before the workload
        run_bronze(s, spark, force_snapshot_step=True)
    _workload(pg_conn)
    events = {}
    for p, s in settings.items():
        run_bronze(s, spark, force_snapshot_step=False)
        run_silver(s, spark)
        events[p] = _events(tmp_path / p)

    base = events["pgoutput"]
    assert [e["op"] for e in base] == ["c"] * 5 + ["u", "d", "c", "d", "t", "c"]
    for plugin in ("wal2json", "decoderbufs"):
        got = events[plugin]
        want = [e for e in base if plugin != "decoderbufs" or e["op"] != "t"]
        assert [e["op"] for e in got] == [e["op"] for e in want], plugin
        for g, w in zip(got, want, strict=True):
            assert g["source"]["lsn"] == w["source"]["lsn"], plugin
            assert g["source"]["txId"] == w["source"]["txId"], plugin
            if plugin != "decoderbufs":
                assert g["__commit_lsn"] == w["__commit_lsn"]
            assert g["__toast_unchanged"] == w["__toast_unchanged"], (plugin, w["op"])
            for image in ("before", "after"):
                if w[image] is None:
                    assert g[image] is None, (plugin, image)
                    continue
                for column, value in w[image].items():
                    other = g[image][column]
                    if plugin == "wal2json" and _non_finite(value):
                        assert other is None, (column, value)  # wal2json: JSON null
                        continue
                    assert _same(other, value), (plugin, w["op"], image, column, other, value)
    # the difference that reaches silver: without TRUNCATE, decoderbufs' silver keeps row 10
    silver = {p: sorted(r["id"] for r in DeltaTable(table_uri(
        str(tmp_path / p), "silver", "public", "kinds")).to_pyarrow_table().to_pylist()
        if not r["__deleted"]) for p in PLUGINS}
    assert silver["pgoutput"] == silver["wal2json"] == [5]
    assert silver["decoderbufs"] == [1, 4, 5, 10]
