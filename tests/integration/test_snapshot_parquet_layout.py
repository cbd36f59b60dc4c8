"""The snapshot's Parquet layout is cheap to write and invisible to every reader.

A real snapshot (``run_bronze``: slot, Spark chunk tasks, delta-rs commits) of a table with
a sequential key, a bigint spread over the whole int64 range, smallint/int (with NULLs),
date, timestamp, timestamptz, an all-NULL int, an int array and text. Each bronze and silver
data file must show the layout ``capture/snapshot_convert.py`` describes:

* integer-physical data columns without dictionary are DELTA_BINARY_PACKED and
  uncompressed (``key.id``, ``after.id``, list elements, silver dates and timestamps),
  except the full-range bigint, which stays PLAIN + zstd;
* string constants (the row markers too) are written through their one-value dictionary,
  integer constants (``__commit_lsn``, ``source.lsn``, silver ``__lsn`` ...) dictionary-
  encoded too, low-cardinality data (the all-NULL int) through a planned dictionary;
* constant and all-NULL columns are uncompressed, the other data columns zstd;
* constant columns that are never NULL (``op``, ``ts_ms``, ``source.lsn``, silver ``__lsn``
  ...) are REQUIRED; the NULL ones (``source.txId``) stay optional;
* bronze's columns NULL in every snapshot row (``before``, ``transaction``,
  ``__toast_unchanged``) are not in the files.

Then the tables read back the same through delta-rs (its pyarrow reader and DataFusion),
through Spark's Parquet reader given the table's schema (``read_bronze``, the Spark silver
preparer's reader: snapshot files alone, and with stream-written files that hold those
columns), through the Arrow preparer's reader (``read_files``) and after bronze's
compaction rewrote them, and equal the source rows.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.cdc.silver_batch import INPUT_COLUMNS
from pgcdc_dagster.lake.bronze_read import read_files
from pgcdc_dagster.lake.parquet_layout import leaf_arrays as _leaf_arrays
from pgcdc_dagster.lake.parquet_layout import parquet_columns
from pgcdc_dagster.lake.parquet_layout import wide as _wide
from pgcdc_dagster.lake.upkeep import compact_bronze
from pgcdc_dagster.spark.silver_batch import prepare, read_bronze
from tests.support.compare import assert_silver_equals_source, source_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROWS = 30_000
TABLE = f"""
CREATE TABLE lay (id bigint PRIMARY KEY, r bigint NOT NULL, i2 smallint, i4 int, d date,
                  ts timestamp, tz timestamptz, nothing int, arr int[], s text,
                  n numeric(12, 2), w numeric(30, 4));
INSERT INTO lay SELECT g, hashtextextended('r' || g, 0), (g % 30000 - 15000)::smallint,
  CASE WHEN g % 7 = 0 THEN NULL ELSE g * 37 % 100003 END, date '2001-01-01' + g,
  timestamp '2020-01-01' + g * interval '1.5 second',
  timestamptz '2020-01-01+00' + g * interval '1 minute', NULL, ARRAY[g, -g, g * 3],
  'text ' || g, (g % 100000 - 50000) / 100.0, g * 1234567.0001
FROM generate_series(1, {ROWS}) g;
"""

DELTA, DICT, PLAIN = "delta", "dict", "plain"
ZSTD, NONE = "ZSTD", "UNCOMPRESSED"
INTS = ["id", "i2", "i4", "d", "ts", "arr.list.element"]
"""The integer leaves of a bronze image (``tz`` is a string in bronze) but ``r``."""
BRONZE = {
    **{f"after.{c}": (DELTA, NONE) for c in ["id", *INTS]},
    "key.id": (DELTA, NONE),
    "after.r": (PLAIN, ZSTD),  # spread over the whole int64 range: PLAIN + zstd
    "after.nothing": (DICT, ZSTD),  # all NULL: planned low-cardinality
    "after.tz": (PLAIN, ZSTD), "after.s": (PLAIN, ZSTD),
    "after.n": (PLAIN, ZSTD), "after.w": (PLAIN, ZSTD),  # Decimal bytes (precise mode)
    # constants: through a one-value dictionary, uncompressed (the NULL ones: DELTA pages
    # without values)
    **{f"source.{c}": (DICT, NONE) for c in ["version", "connector", "name", "snapshot",
                                             "db", "sequence", "schema", "table", "ts_ms",
                                             "ts_us", "lsn"]},
    **{f"source.{c}": (DELTA, NONE) for c in ["txId", "xmin"]},
    "op": (DICT, NONE), "ts_ms": (DICT, NONE), "__commit_lsn": (DICT, NONE),
    "__ordinal": (DICT, NONE),
}
"""Every bronze column: (encoding, codec); ``before``, ``transaction`` and
``__toast_unchanged``, NULL in every snapshot row, are not written."""
SILVER = {
    **{c: (DELTA, NONE) for c in ["id", "i2", "i4", "d", "ts", "tz", "arr.list.element"]},
    **{c: (DICT, NONE) for c in ["__lsn", "__commit_lsn", "__ordinal", "__source_ts_ms"]},
    "r": (PLAIN, ZSTD), "s": (PLAIN, ZSTD), "nothing": (DICT, ZSTD),
    "n": (DELTA, NONE),  # NUMERIC(12,2): stored as INT64, so delta-packed
    "w": (PLAIN, ZSTD),  # NUMERIC(30,4): fixed-size binary
    "__op": (DICT, NONE), "__deleted": (PLAIN, ZSTD),
}
"""Every silver column: (encoding, codec)."""
BRONZE_REQUIRED = ["op", "ts_ms", "source.version", "source.ts_ms", "source.snapshot",
                   "source.sequence", "source.ts_us", "source.lsn", "__commit_lsn",
                   "__ordinal"]
"""Leaves with no definition level (``source`` itself is required in the table schema)."""
BRONZE_OPTIONAL = {"source.txId": 1, "source.xmin": 1, "after.id": 2, "key.id": 2}
"""Leaves that keep their definition levels (NULL constants, data): the maximum level."""
SILVER_REQUIRED = ["id", "__op", "__lsn", "__commit_lsn", "__ordinal", "__source_ts_ms",
                   "__deleted"]
SILVER_OPTIONAL = {"r": 1, "i4": 1, "ts": 1}


def _settings(dsn: str, lakehouse: Path) -> CaptureSettings:
    return CaptureSettings(dsn=dsn, lakehouse=str(lakehouse), include=("public\\.lay",),
                           slot="layout", publication="layout",
                           snapshot_chunk_bytes=512 << 10, snapshot_max_threads=2)


def _columns(path: str) -> dict[str, dict[str, Any]]:
    """Per leaf column of the file's first row group: encodings, codec, definition level."""
    parquet = pq.ParquetFile(path)
    group = parquet.metadata.row_group(0)
    out = {}
    for i in range(group.num_columns):
        col = group.column(i)
        out[col.path_in_schema] = {
            "encodings": set(col.encodings), "codec": col.compression,
            "max_def": parquet.schema.column(i).max_definition_level,
            "physical": col.physical_type}
    return out


def _assert_layout(path: str, expected: dict[str, tuple[str, str]], required: list[str],
                   optional: dict[str, int]) -> None:
    cols = _columns(path)
    assert cols.keys() == expected.keys()
    for name, (encoding, codec) in expected.items():
        encodings = cols[name]["encodings"]
        got = DELTA if "DELTA_BINARY_PACKED" in encodings else \
            DICT if "RLE_DICTIONARY" in encodings else PLAIN
        assert (got, cols[name]["codec"]) == (encoding, codec), (path, name, cols[name])
    for name in required:
        assert cols[name]["max_def"] == 0, (name, cols[name])
    for name, level in optional.items():
        assert cols[name]["max_def"] == level, (name, cols[name])


def _norm(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    return value


def _by_key(table: pa.Table, key: str) -> dict[Any, dict[str, Any]]:
    out = {}
    for rec in table.to_pylist():
        k = rec[key]["id"] if isinstance(rec[key], dict) else rec[key]
        out[k] = _norm(rec)
    return out


def _spark_table(spark: Any, files: list[str], schema: pa.Schema | None = None) -> pa.Table:
    if schema is None:
        return spark.read.option("mergeSchema", "true").parquet(*files).toArrow()
    return read_bronze(spark, files, schema).toArrow()


def _events(table: pa.Table) -> list[dict[str, Any]]:
    return sorted((_norm(r) for r in table.to_pylist()),
                  key=lambda r: (r["__commit_lsn"], r["__ordinal"], r["key"]["id"]))


def _delta_files(uri: str) -> Iterator[str]:
    yield from DeltaTable(uri).file_uris()


def test_snapshot_files_layout_and_readers(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(TABLE)
    settings = _settings(pg_dsn, lakehouse)
    run_bronze(settings, spark, force_snapshot_step=True)
    ctx = load_contexts(settings)[0]
    bronze_files = list(_delta_files(ctx.bronze_uri))
    silver_files = list(_delta_files(ctx.silver_uri))
    assert len(bronze_files) > 1 and len(silver_files) == len(bronze_files)

    # The layout, file by file.
    for path in bronze_files:
        _assert_layout(path, BRONZE, BRONZE_REQUIRED, BRONZE_OPTIONAL)
    for path in silver_files:
        _assert_layout(path, SILVER, SILVER_REQUIRED, SILVER_OPTIONAL)
        assert _columns(path)["n"]["physical"] == "INT64"  # decimals up to 18 digits

    # The Delta tables' schemas are the committed ones: nullable where the table says so.
    silver_schema = pa.schema(DeltaTable(ctx.silver_uri).schema().to_arrow())
    assert silver_schema.field("__lsn").nullable and silver_schema.field("r").nullable
    bronze_schema = pa.schema(DeltaTable(ctx.bronze_uri).schema().to_arrow())
    assert bronze_schema.field("op").nullable and bronze_schema.field("ts_ms").nullable

    # delta-rs (pyarrow dataset reader): silver equals the source, value for value.
    assert assert_silver_equals_source(pg_conn, ctx.silver_uri, "public", "lay",
                                       ["id"]) == ROWS
    source = source_rows(pg_conn, "public", "lay", ["id"])
    silver = _by_key(DeltaTable(ctx.silver_uri).to_pyarrow_table(), "id")
    # delta-rs through DataFusion (the Rust Parquet reader) reads the same values.
    for name, uri in (("s", ctx.silver_uri), ("b", ctx.bronze_uri)):
        fused = pa.table(QueryBuilder().register(name, DeltaTable(uri)).execute(
            f"SELECT * FROM {name}").read_all())
        assert _by_key(fused, "id" if name == "s" else "key") == (
            silver if name == "s" else _by_key(DeltaTable(uri).to_pyarrow_table(), "key"))
    # Spark's Parquet reader on the same files: the same silver and bronze rows.
    spark_silver = _by_key(_spark_table(spark, silver_files), "id")
    assert spark_silver == silver
    for k, rec in spark_silver.items():
        want = source[(k,)]
        assert {c: rec[c] for c in want} == want, k
    bronze = _by_key(DeltaTable(ctx.bronze_uri).to_pyarrow_table(), "key")
    bronze_schema = pa.schema(DeltaTable(ctx.bronze_uri).schema().to_arrow())
    assert _by_key(_spark_table(spark, bronze_files, bronze_schema), "key") == bronze
    assert _by_key(read_files(bronze_files, bronze_schema), "key") == bronze
    assert len(bronze) == ROWS
    markers = Counter(rec["source"]["snapshot"] for rec in bronze.values())
    assert markers == {"true": ROWS - 2, "first": 1, "last": 1}
    assert bronze[1]["source"]["snapshot"] == "first"
    assert bronze[ROWS]["source"]["snapshot"] == "last"
    for k, rec in bronze.items():
        want = source[(k,)]
        after = rec["after"]
        assert rec["key"] == {"id": k} and rec["before"] is None and rec["op"] == "r"
        assert rec["transaction"] is None and rec["__toast_unchanged"] is None
        assert rec["source"]["txId"] is None and rec["source"]["lsn"] == rec["__commit_lsn"]
        assert [after[c] for c in ("id", "r", "i2", "i4", "nothing", "arr", "s")] == \
            [want[c] for c in ("id", "r", "i2", "i4", "nothing", "arr", "s")], k
        assert after["d"] == (want["d"] - dt.date(1970, 1, 1)).days
        assert after["ts"] == (want["ts"] - dt.datetime(1970, 1, 1)) // dt.timedelta(
            microseconds=1)

    # A silver batch prepared in Spark from the snapshot files alone (a rebuild, a catch-up
    # after an incremental snapshot): the columns they lack read as null.
    read = pa.schema([bronze_schema.field(c) for c in INPUT_COLUMNS])
    batch = prepare(spark, bronze_files, ["id"], ctx.toastable, read)
    assert batch.rows.num_rows == ROWS and batch.truncate_seq is None and not batch.lookups
    for rec in batch.rows.to_pylist():
        assert rec["op"] == "r" and rec["__toast_unchanged"] is None, rec
        assert {c: rec["image"][c] for c in ("id", "r", "i4", "arr", "s")} == \
            {c: bronze[rec["image"]["id"]]["after"][c] for c in ("id", "r", "i4", "arr", "s")}

    # Stream changes, then prepare a silver batch in Spark from every bronze file: the
    # snapshot files (required constants, dictionary and DELTA ints, no ``before``) read
    # with the stream-written ones under the table's schema.
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE lay SET r = r / 2, i4 = NULL, arr = ARRAY[7] WHERE id % 1000 = 1")
        cur.execute("DELETE FROM lay WHERE id IN (5, 6)")
        cur.execute("INSERT INTO lay (id, r, s) VALUES (1000000, 42, 'new')")
    run_bronze(settings, spark, force_snapshot_step=False)
    all_files = list(_delta_files(ctx.bronze_uri))
    assert len(all_files) > len(bronze_files)
    bronze_schema = pa.schema(DeltaTable(ctx.bronze_uri).schema().to_arrow())
    read = pa.schema([bronze_schema.field(c) for c in INPUT_COLUMNS])
    batch = prepare(spark, all_files, ["id"], ctx.toastable, read)
    assert batch.rows.num_rows == ROWS + 1  # every key's latest event, the deletes included
    # Every reader reads the mixed files alike: delta-rs, Spark and the Arrow reader.
    events = _events(DeltaTable(ctx.bronze_uri).to_pyarrow_table())
    assert _events(_spark_table(spark, all_files, bronze_schema)) == events
    assert _events(read_files(all_files, bronze_schema)) == events
    assert any(e["before"] is not None for e in events if e["op"] == "d")
    source = source_rows(pg_conn, "public", "lay", ["id"])
    images = {}
    for rec in batch.rows.to_pylist():
        images[rec["image"]["id"]] = (rec["op"], rec["image"])
    assert images.keys() == {k for (k,) in source} | {5, 6}
    assert images[5][0] == "d" and images[6][0] == "d"
    for (k,), want in source.items():
        op, image = images[k]
        assert op in ("r", "u", "c"), (k, op)
        assert [image[c] for c in ("r", "i4", "arr", "s")] == \
            [want[c] for c in ("r", "i4", "arr", "s")], k
    run_silver(settings, spark)
    assert assert_silver_equals_source(pg_conn, ctx.silver_uri, "public", "lay",
                                       ["id"]) == ROWS - 1
    # Bronze's compaction rewrites the snapshot files with the stream's: the same events.
    compacted = compact_bronze(ctx.bronze_uri, ctx.silver_uri, ctx.silver_app_id, 64 << 20)
    assert compacted.files_removed == len(all_files) and compacted.files_added >= 1
    assert _events(DeltaTable(ctx.bronze_uri).to_pyarrow_table()) == events


def test_sampled_leaves_are_named_like_the_parquet_columns() -> None:
    """The width plan samples each leaf under the name the writer options use (nested
    lists, maps, structs in lists), and tells wide integers from narrow ones."""
    typ = pa.struct([
        ("i", pa.int64()), ("arr", pa.list_(pa.int32())),
        ("rows", pa.large_list(pa.struct([("d", pa.date32()), ("t", pa.timestamp("us"))]))),
        ("m", pa.map_(pa.string(), pa.int64())), ("s", pa.string())])
    value = {"i": 1, "arr": [1, 2], "rows": [{"d": dt.date(2020, 1, 1), "t": None}],
             "m": [("k", 3)], "s": "x"}
    table = pa.table({"after": pa.array([value, None], typ), "n": pa.array([1, 2], pa.int16())})
    named = {path for name in table.column_names
             for path, _ in _leaf_arrays(name, table.column(name).combine_chunks())}
    assert named == {path for path, _ in parquet_columns(table.schema)}
    assert _wide(pa.array([-2**63, 2**63 - 1]), 64) and _wide(pa.array([0, 2**28], pa.int32()), 32)
    assert not _wide(pa.array([0, 2**27 - 1], pa.int32()), 32)
    assert not _wide(pa.array(range(100_000), pa.int64()), 64)
    assert not _wide(pa.array([None, None], pa.int64()), 64)  # no values: delta packing
    stamps = pa.array([0, 2**62], pa.timestamp("us"))
    assert _wide(stamps, 64) and not _wide(stamps.slice(0, 1), 64)
