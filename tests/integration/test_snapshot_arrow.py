"""Snapshot chunks converted from native Arrow values equal chunks converted from text, file
for file (SNAP-, TYPE- items).

One table holds every type read natively (integers, floats, booleans, text types, json,
jsonb, TIMESTAMPTZ of several precisions, DATE) next to columns that travel as their text
output (numeric, interval, uuid, inet, bpchar, arrays, a composite whose fields are all
NULL, an enum), with ordinary and odd values: NULLs, extremes, NaN/±Infinity/-0 floats,
escapes and multi-byte text, infinite/BC/5-digit-year timestamps and dates (the guard
columns' path). The same chunk is read once with native columns and once with every column
as its text output, through the same Arrow reader; the bronze and silver Parquet files must
hold the same values.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg2 import sql

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.capture.snapshot_arrow import arrow_select, native_kind
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.cdc.typeconv import TypeModes
from pgcdc_dagster.lake.delta import ensure_table
from pgcdc_dagster.postgres.arrow_reader import read_batches
from pgcdc_dagster.postgres.chunk_plan import key_columns
from pgcdc_dagster.postgres.connection import connection
from pgcdc_dagster.postgres.snapshot_read import Chunk, chunk_query
from pgcdc_dagster.spark.snapshot_tasks import ChunkTask, run_chunk

pytestmark = [pytest.mark.integration]

TABLE = """
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TYPE pair AS (a int, b text);
CREATE TABLE t (
  id int PRIMARY KEY, i2 smallint, i8 bigint, f4 real, f8 double precision, b boolean,
  s text, v varchar(20), c char(5), j json, jb jsonb,
  tz timestamptz, tz0 timestamptz(0), tz3 timestamptz(3), d date, dn date NOT NULL,
  n numeric(12,2), nu numeric, iv interval, u uuid, ip inet, arr int[], tarr text[],
  p pair, m mood, bits bit(4))
"""

ROWS = """
INSERT INTO t SELECT g, (g % 30000)::smallint, g::bigint * 1000003, g / 7.0, g / 3.0,
  g % 3 = 0, 'row ' || g || repeat('x', g % 20), 'v' || g, 'c' || (g % 10),
  json_build_object('g', g), jsonb_build_object('g', g, 'tag', 't' || g % 5),
  timestamptz '2020-02-29 12:34:56.789012+00' + g * interval '1 minute 1.000123 second',
  timestamptz '2021-01-01+00' + g * interval '1 hour', now() + g * interval '1 ms',
  date '2000-01-01' + g, date '1999-12-31' - g,
  g * 1.25, g / 7.0, g * interval '1 day 1 second', md5(g::text)::uuid,
  ('10.0.' || g % 256 || '.1')::inet, ARRAY[g, NULL, -g], ARRAY['a' || g, NULL, 'q"'],
  ROW(g, 'p' || g)::pair, (CASE WHEN g % 2 = 0 THEN 'sad' ELSE 'happy' END)::mood,
  B'1010'
FROM generate_series(1, 5000) g;
INSERT INTO t (id, dn) VALUES (5001, '2000-01-01');
INSERT INTO t VALUES (5002, -32768, -9223372036854775808, 'NaN', '-Infinity', false,
  E'tab\\there\\nnew line \\\\ back ünïcødé €', '', '   ', '[]', '{"a": "ü\\"q"}',
  'infinity', '-infinity', '0044-03-15 12:00:00.5+00 BC', '12345-06-07', '-infinity',
  -0.01, 'NaN', '-178000000 years', '00000000-0000-0000-0000-000000000000', '::1/128',
  '{}', '{"", NULL, "a b"}', ROW(NULL, NULL), NULL, NULL);
INSERT INTO t VALUES (5003, 32767, 9223372036854775807, '-0', 'Infinity', true,
  repeat('long value ', 50), 'exactly twelve', 'abcde', 'null', 'null',
  '0001-01-01 00:00:00+00', '9999-12-31 23:59:59+00', '1999-12-31 23:59:59.999+00',
  '0001-01-01', 'infinity', 9999999999.99, '1e-30', '1 microsecond', NULL, NULL,
  NULL, NULL, NULL, 'sad', B'0000');
INSERT INTO t VALUES (5004, 0, 0, '1e-45', '2.2250738585072014e-308', NULL,
  'x', 'y', 'z', '{"k": [1, 2.50, null]}', '{"k": [1, 2.50, null]}',
  '1970-01-01 00:00:00+00', '1970-01-01 00:00:00.4+00', '1970-01-01 00:00:00.0005+00',
  '1970-01-01', '0099-12-31 BC', 0, 0, '0', NULL, NULL, NULL, NULL, NULL, NULL, NULL);
"""


def _task(dsn: str, ctx, key, lakehouse: Path, *, binary: bool, prefix: str) -> ChunkTask:
    return ChunkTask(dsn, None, Chunk("public", "t", 0), ctx.relation, ctx.converters,
                     ctx.bronze_schema, ctx.silver_schema, key, None, ctx.bronze_uri,
                     ctx.silver_uri, SourceIdentity("bin", "db"), 42, 1_700_000_000_000,
                     first_marker="first", last_marker="last", row_group_bytes=64 << 10,
                     file_prefix=prefix, binary=binary)


def test_native_chunk_equals_text_chunk(pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(TABLE)
        cur.execute(ROWS)
    # string decimals keep NaN; include_unknown keeps the composite
    settings = CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse),
                               modes=TypeModes(include_unknown=True, decimal="string"))
    ctx = load_contexts(settings)[0]
    kinds = {conv.bronze_field.name: native_kind(conv) for conv in ctx.converters}
    # what travels natively and what as text output (the test covers both)
    assert kinds["i8"] == "int" and kinds["tz"] == "timestamptz" and kinds["d"] == "date"
    assert kinds["jb"] == "text" and kinds["c"] == "text" and kinds["b"] == "bool"
    assert kinds["f4"] == "float" and kinds["dn"] == "date"
    assert kinds["n"] is None and kinds["p"] is None and kinds["arr"] is None
    results = _both_ways(pg_dsn, ctx, lakehouse, rows=5004)
    snapshot = pq.read_table(f"{ctx.bronze_uri}/{results[True].bronze.path}",
                             columns=["source"]).column("source").combine_chunks()
    markers = snapshot.field("snapshot").to_pylist()
    assert markers[0] == "first" and markers[-1] == "last" and set(markers[1:-1]) == {"true"}


def _both_ways(pg_dsn: str, ctx, lakehouse: Path, *, rows: int) -> dict:
    """Read the chunk with native columns and as text; assert the files hold equal values."""
    ensure_table(ctx.bronze_uri, ctx.bronze_schema)
    ensure_table(ctx.silver_uri, ctx.silver_schema)
    with connection(pg_dsn) as conn:
        key = tuple(key_columns(conn, "public", "t"))
    results = {}
    for binary in (True, False):
        result = run_chunk(_task(pg_dsn, ctx, key, lakehouse, binary=binary,
                                 prefix="bin" if binary else "txt"))
        assert result.error is None, result.error
        assert result.rows == rows
        results[binary] = result
    for root, attr in ((ctx.bronze_uri, "bronze"), (ctx.silver_uri, "silver")):
        b_files = _files(root, getattr(results[True], attr))
        t_files = _files(root, getattr(results[False], attr))
        # several batches, markers at both ends
        assert sum(f.metadata.num_row_groups for f in b_files) > 1
        binary_rows = pa.concat_tables([f.read() for f in b_files])
        text_rows = pa.concat_tables([f.read() for f in t_files])
        assert binary_rows.schema == text_rows.schema
        for name in binary_rows.column_names:
            got, want = binary_rows.column(name), text_rows.column(name)
            assert got.type == want.type, (attr, name)
            assert got.null_count == want.null_count, (attr, name)
            assert _first_difference(got, want) is None, (attr, name,
                                                          _first_difference(got, want))
    return results


def _written(written) -> tuple:
    """The Parquet files a chunk wrote to one table (silver: several at the target size)."""
    return written if isinstance(written, tuple) else (written,)


def _files(root: str, written) -> list[pq.ParquetFile]:
    return [pq.ParquetFile(f"{root}/{f.path}") for f in _written(written)]


def _bytes(root: str, written) -> bytes:
    return Path(f"{root}/{written.path}").read_bytes()


def _same(x, y) -> bool:
    """Equal values, NaN equal to NaN (at any depth) and -0.0 told from 0.0."""
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y, strict=True))
    if isinstance(x, float) and isinstance(y, float):
        return (math.isnan(x) and math.isnan(y)) or \
            (x == y and math.copysign(1, x) == math.copysign(1, y))
    return type(x) is type(y) and x == y


def _first_difference(got, want) -> str | None:
    a, b = got.to_pylist(), want.to_pylist()
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if not _same(x, y):
            return f"row {i}: binary {x!r}, text {y!r}"
    return None


def test_non_native_columns_are_selected_as_their_output(pg_dsn, pg_conn, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, flag boolean, net inet, "
                    "pad char(4), p point)")
        cur.execute("INSERT INTO t VALUES (1, true, '10.1.2.3', 'ab', '(1,2)'), "
                    "(2, NULL, NULL, NULL, NULL)")
    ctx = load_contexts(CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse)))[0]
    cols = [c.name for c in ctx.relation.columns]
    kinds = [native_kind(c) for c in ctx.converters]
    query = arrow_select(chunk_query(Chunk("public", "t", 0), cols), cols, kinds)
    batch = next(iter(read_batches(pg_dsn, None, query)))
    # inet through concat(): the output function ('10.1.2.3'), not inet::text ('/32')
    assert batch.column(2).to_pylist() == ["10.1.2.3", None]
    assert batch.column(3).to_pylist() == ["ab  ", None]  # bpchar keeps padding
    assert batch.column(4).to_pylist() == ["(1,2)", None]
    assert batch.column(1).to_pylist() == [True, None]


def test_reader_stops_cleanly_when_the_consumer_stops(pg_dsn, pg_conn) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE big AS SELECT g AS id, repeat('x', 100) AS s "
                    "FROM generate_series(1, 200000) g")
    started = time.monotonic()
    reader = read_batches(pg_dsn, None, sql.SQL("SELECT * FROM big"), batch_bytes=1 << 16)
    first = next(reader)
    assert first.num_rows
    reader.close()  # the read stops and the connection closes
    assert time.monotonic() - started < 30
    with pg_conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                    "'pgcdc_dagster chunk reader' AND datname = current_database()")
        deadline = time.monotonic() + 10
        while cur.fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.1)
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                        "'pgcdc_dagster chunk reader' AND datname = current_database()")
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                    "'pgcdc_dagster chunk reader' AND datname = current_database()")
        assert cur.fetchone()[0] == 0
