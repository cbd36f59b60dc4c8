"""The snapshot's vectorised fast paths equal the converters, value for value.

The TIMESTAMPTZ converter's own numpy path (which the stream takes) is checked against its
general path on the same values.

Real PostgreSQL text (read through the snapshot reader, so with its pinned session settings)
for TIMESTAMPTZ/TIMESTAMP of every precision, DATE and NUMERIC(p,s), ordinary and odd values
(years 1..9999, BC, 5-digit years, infinities, NULLs, NaN), under every time precision mode.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.capture.snapshot_fastpath import _FAST, fast_convert
from pgcdc_dagster.cdc.typeconv import TypeModes
from pgcdc_dagster.cdc.typeconv.temporal import TimestampTzConverter
from pgcdc_dagster.exceptions import UnsupportedTypeError
from pgcdc_dagster.postgres.arrow_reader import read_batches, text_select
from pgcdc_dagster.postgres.snapshot_read import Chunk, chunk_query

pytestmark = [pytest.mark.integration]

COLUMNS = """id int PRIMARY KEY,
  tz timestamptz, tz0 timestamptz(0), tz3 timestamptz(3), tz5 timestamptz(5),
  ts timestamp, ts0 timestamp(0), ts2 timestamp(2), ts4 timestamp(4),
  d date, n numeric(12,2), n0 numeric(9,0), n38 numeric(38,10), n5 numeric(5,5)"""

ORDINARY = """
INSERT INTO t SELECT g,
  ts, ts, ts, ts, ts, ts, ts, ts, ts::date,
  round((random() - 0.5)::numeric * 2e9, 2), round((random() - 0.5)::numeric * 1e8),
  round((random() - 0.5)::numeric * 1e27, 10), round(random()::numeric * 0.99, 5)
FROM (SELECT g, timestamptz '0001-01-01 00:00:00+00'
             + random() * (timestamptz '9999-12-31 23:59:59+00' - timestamptz '0001-01-01+00')
             AS ts FROM generate_series(1, 3000) g) s;
INSERT INTO t (id) VALUES (3001);
"""

ODD = [
    "'0001-01-01 00:00:00+00'", "'0099-06-30 12:00:00.5+00'", "'0999-12-31 23:59:59.999999+00'",
    "'1000-01-01+00'", "'9999-12-31 23:59:59.999999+00'", "'0044-03-15 12:00:00+00 BC'",
    "'infinity'", "'-infinity'", "'12000-01-01 00:00:00+00'", "'1970-01-01 00:00:00+00'",
]


def _columns(settings: CaptureSettings, table: str):
    ctx = next(c for c in load_contexts(settings) if c.relation.name == table)
    cols = [c.name for c in ctx.relation.columns]
    query = chunk_query(Chunk("public", table, 0), cols)
    data = pa.Table.from_batches(list(read_batches(settings.dsn, None,
                                                   text_select(query, cols))))
    return ctx, data


def _check(ctx, data, *, expect_fast: bool) -> int:
    fast_hits = 0
    for i, conv in enumerate(ctx.converters):
        text = data.column(i).combine_chunks()
        try:
            expected = (conv.to_bronze(text), conv.to_silver(text))
        except UnsupportedTypeError:
            with pytest.raises(UnsupportedTypeError):
                fast_convert(conv, text)
            continue
        if isinstance(conv, TimestampTzConverter):
            # The converter's own numpy path (shared with the stream) equals its general one.
            general = conv.bronze_general(text)
            assert expected[0].equals(general), conv
        bronze, silver = fast_convert(conv, text)
        assert bronze.equals(expected[0]), (conv, bronze.type, expected[0].type)
        assert silver.equals(expected[1]), (conv, silver.type, expected[1].type)
        fast = _FAST.get(type(conv))
        if fast is not None and fast(conv, text) is not None:
            fast_hits += 1
    if expect_fast:
        assert fast_hits == len(ctx.converters) - 1, "every typed column took its fast path"
    return fast_hits


@pytest.mark.parametrize("precision", ["adaptive", "adaptive_time_microseconds", "connect"])
def test_fast_paths_equal_the_converters(precision, pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE TABLE t ({COLUMNS}); " + ORDINARY)
        cur.execute(f"CREATE TABLE odd ({COLUMNS})")
        for i, value in enumerate(ODD):
            ts = f"{value}::timestamptz"
            cur.execute(f"""INSERT INTO odd VALUES ({i}, {ts}, {ts}, {ts}, {ts},
                {ts}::timestamp, {ts}::timestamp, {ts}::timestamp, {ts}::timestamp,
                {ts}::date, -0.01, 0, 0, 0.00001)""")
    modes = TypeModes(time_precision=precision)
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), modes=modes)
    ctx, data = _columns(settings, "t")
    _check(ctx, data, expect_fast=True)
    _check(ctx, data.slice(1000, 2001), expect_fast=True)  # arrays with an offset
    ctx, data = _columns(settings, "odd")
    _check(ctx, data, expect_fast=False)
    for i in range(len(ODD)):  # each odd value alone, and among ordinary ones
        _check(ctx, data.slice(i, 1), expect_fast=False)


def test_numeric_specials_keep_the_converter_error(pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, n numeric(10,2)); "
                    "INSERT INTO t VALUES (1, 1.5), (2, 'NaN'), (3, NULL)")
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse))
    ctx, data = _columns(settings, "t")
    conv = ctx.converters[1]
    with pytest.raises(UnsupportedTypeError, match=r"decimal\.handling\.mode"):
        fast_convert(conv, data.column(1).combine_chunks())
