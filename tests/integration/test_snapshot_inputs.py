"""Bad input and per-table options: snapshot.select.statement.overrides (validated as
one read-only SELECT), snapshot.include.collection.list, a table that vanishes while it is
read, and a value the configured handling mode cannot convert (SNAP-25, CFG-40, TYPE-08)."""

from __future__ import annotations

import dataclasses

import psycopg2
import pytest

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.snapshot import run_snapshot
from pgcdc_dagster.cdc.typeconv import TypeModes
from pgcdc_dagster.exceptions import ConfigurationError, UnsupportedTypeError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.lake.silver import live_rows
from pgcdc_dagster.postgres.arrow_reader import read_batches, text_select
from pgcdc_dagster.postgres.chunk_plan import (
    PARALLEL_MIN_CHUNK_BYTES,
    chunk_counts,
    key_columns,
    plan_chunks,
    plan_key_chunks,
    table_size,
)
from pgcdc_dagster.postgres.snapshot_override import validate_override
from pgcdc_dagster.postgres.snapshot_read import (
    MAX_BLOCK_BYTES,
    MIN_BLOCK_BYTES,
    Chunk,
    TableVanishedError,
    block_bytes,
    chunk_query,
)
from tests.integration.test_snapshot import (
    SCHEMA,
    bronze_table,
    check_converged,
    settings_for,
    snapshot_keys,
)

pytestmark = [pytest.mark.integration]

ITEMS_COLUMNS = [("id", 20), ("name", 25), ("price", 1700), ("at", 1184), ("note", 25)]


@pytest.mark.parametrize(("select", "why"), [
    ("DELETE FROM items RETURNING *", "read-only SELECT"),
    ("SELECT * FROM items; DROP TABLE items", "more than one statement"),
    ("SELECT * FROM items WHERE note <> ';'; DELETE FROM items", "more than one statement"),
    ("WITH d AS (DELETE FROM items RETURNING *) SELECT * FROM d", "read-only SELECT"),
    ("SELECT * FROM items FOR UPDATE", "read-only SELECT"),
    ("SELECT id, name, price, at FROM items", "missing: note"),
    ("SELECT id, name, price::text AS price, at, note FROM items", "other types"),
    ("", "empty"),
])
def test_override_must_be_one_read_only_select(select, why, pg_conn) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA + "; CREATE SEQUENCE s")
    with pytest.raises(ConfigurationError, match=why) as info:
        validate_override(pg_conn, "public", "items", select, ITEMS_COLUMNS)
    assert "snapshot.select.statement.overrides.public.items" in str(info.value)
    with pg_conn.cursor() as cur:
        cur.execute("SELECT count(*), last_value FROM items, s GROUP BY last_value")
        assert cur.fetchone() == (20000, 1), "nothing was modified"


def test_override_accepts_a_select(pg_conn) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    body = validate_override(pg_conn, "public", "items",
                             "SELECT *, 1 AS extra FROM items WHERE note <> ';' ;",
                             ITEMS_COLUMNS)
    assert body.rstrip().endswith("<> ';'")


@pytest.mark.spark
def test_override_and_include_list_end_to_end(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA + "; CREATE SEQUENCE s; "
                    "CREATE TABLE other (id int PRIMARY KEY, v text); "
                    "INSERT INTO other SELECT g, 'o' FROM generate_series(1, 100) g")
    bad = settings_for(pg_dsn, lakehouse,
                       snapshot_select_overrides=(("public.nope", "SELECT 1"),))
    with pytest.raises(ConfigurationError, match="not a captured table"):
        run_bronze(bad, spark, force_snapshot_step=True)
    # A SELECT that writes through a function is refused by the parser-based check.
    writes = settings_for(pg_dsn, lakehouse / "w", slot="w", publication="w",
                          include=("public\\.other",), snapshot_select_overrides=(
                              ("public.other", "SELECT nextval('s')::int AS id, v FROM other"),))
    with pytest.raises(ConfigurationError, match="function nextval is not allowed in an "
                       "override"):
        run_snapshot(writes, spark, force=True)
    settings = settings_for(
        pg_dsn, lakehouse, snapshot_include=("public\\.(items|pairs)",),
        snapshot_select_overrides=(("public.items", "SELECT * FROM items WHERE id % 2 = 0"),))
    run = run_bronze(settings, spark, force_snapshot_step=True)
    assert run.snapshot is not None and run.snapshot.empty_tables == ["public.other"]
    keys = snapshot_keys(lakehouse, "items")
    assert len(keys) == 10000 and all(k[0] % 2 == 0 for k in keys)
    assert len(snapshot_keys(lakehouse, "pairs")) == 6000
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE other SET v = 'changed' WHERE id = 7; UPDATE items SET price = 0 "
                    "WHERE id = 3")
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    # other: streamed from the snapshot's point, without its earlier rows.
    assert live_rows(table_uri(str(lakehouse), "silver", "public", "other"))["id"].to_pylist() \
        == [7]
    items = live_rows(table_uri(str(lakehouse), "silver", "public", "items"))["id"].to_pylist()
    assert len(items) == 10001 and 3 in items


@pytest.mark.spark
@pytest.mark.parametrize("threads", [1, 0], ids=["job-per-chunk", "one-job"])
def test_table_vanishing_during_the_snapshot(threads, pg_dsn, pg_conn, spark,
                                             lakehouse) -> None:
    """Both ways of running the chunks: one Spark job per chunk (snapshot.max.threads below
    the parallelism) and all chunks in one job reporting as they finish (the default)."""
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    settings = settings_for(pg_dsn, lakehouse, snapshot_max_threads=threads)
    dropper = psycopg2.connect(pg_dsn)
    dropper.autocommit = True

    def drop_pairs(progress) -> None:
        if progress.chunks_done == 1:
            with dropper.cursor() as cur:
                cur.execute("DROP TABLE pairs")

    with pytest.raises(TableVanishedError, match=r"pairs.*does not exist.*include.list"):
        run_snapshot(settings, spark, force=True, on_progress=drop_pairs)
    dropper.close()
    # the other table was committed (its snapshot commit creates it: version 0)
    assert bronze_table(lakehouse, "items").version() == 0
    run_bronze(settings, spark, force_snapshot_step=False)
    run_silver(settings, spark)
    check_converged(pg_conn, lakehouse, tables=("items",))


@pytest.mark.spark
def test_unconvertible_value_names_column_and_mode(pg_dsn, pg_conn, spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE m (id int PRIMARY KEY, amount numeric); "
                    "INSERT INTO m SELECT g, g / 7.0 FROM generate_series(1, 5000) g; "
                    "UPDATE m SET amount = 'NaN' WHERE id = 4321")
    settings = settings_for(pg_dsn, lakehouse, snapshot_chunk_bytes=32 << 10)
    with pytest.raises(UnsupportedTypeError,
                       match=r"public\.m: column 'amount'.*decimal\.handling\.mode"):
        run_bronze(settings, spark, force_snapshot_step=True)
    # The user switches the mode: the open snapshot is finished with the new converters
    # (chunks written under the old mode are read again, never mixed in).
    fixed = dataclasses.replace(settings, modes=TypeModes(decimal="string"))
    run = run_bronze(fixed, spark, force_snapshot_step=False)
    assert run.snapshot is not None and run.snapshot.performed
    assert run.snapshot.resumed_chunks == 0
    run_silver(fixed, spark)
    rows = live_rows(table_uri(str(lakehouse), "silver", "public", "m"))
    assert rows.num_rows == 5000
    assert dict(zip(rows["id"].to_pylist(), rows["amount"].to_pylist(),
                    strict=True))[4321] == "NaN"


def test_ctid_ranges_read_every_row_once(pg_dsn, pg_conn) -> None:
    """The CTID path (tables without a usable key): block ranges partition the heap."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE nokey (v int, t text); INSERT INTO nokey SELECT g, "
                    "repeat('x', g % 300) FROM generate_series(1, 20000) g; "
                    "DELETE FROM nokey WHERE v % 5 = 0")
        blocks = table_size(pg_conn, "public", "nokey").blocks
        assert key_columns(pg_conn, "public", "nokey") == []
    chunks = plan_chunks("public", "nokey", blocks, max(1, blocks // 7))
    assert len(chunks) >= 7 and chunks[-1].end_block is None
    seen: list[int] = []
    for chunk in chunks:
        query = chunk_query(chunk, ["v", "t"])
        for batch in read_batches(pg_dsn, None, query):
            seen.extend(int(v) for v in batch.column(0).to_pylist())
    assert sorted(seen) == [v for v in range(1, 20001) if v % 5]


def test_fetch_size_sizes_the_reader_blocks(pg_dsn, pg_conn) -> None:
    """snapshot.fetch.size (SNAP-26): rows per read. COPY streams, so it sizes
    the reader's batches (fetch size x the table's average row), clamped so a reader's memory
    stays bounded; a larger fetch size reads in fewer, larger batches."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE f (id int PRIMARY KEY, t text); INSERT INTO f SELECT g, "
                    "repeat('y', 200) FROM generate_series(1, 40000) g; ANALYZE f")
        size = table_size(pg_conn, "public", "f")
    assert block_bytes(1, size.row_bytes) == MIN_BLOCK_BYTES
    assert block_bytes(10**9, size.row_bytes) == MAX_BLOCK_BYTES
    middle = block_bytes(2000, size.row_bytes)
    assert MIN_BLOCK_BYTES < middle < MAX_BLOCK_BYTES
    query = chunk_query(Chunk("public", "f", 0), ["id", "t"])
    shapes = {}
    for fetch in (1, 2000, 10**9):
        block = block_bytes(fetch, size.row_bytes)
        rows = [b.num_rows for b in read_batches(pg_dsn, None, text_select(query, ["id", "t"]),
                                                 batch_bytes=block)]
        assert sum(rows) == 40000
        assert max(rows) * 205 <= 2 * block  # about one block of text per batch
        shapes[fetch] = len(rows)
    assert shapes[1] > shapes[2000] > shapes[10**9]


@pytest.mark.spark
def test_a_table_read_alone_is_spread_over_the_slots(pg_dsn, pg_conn, spark, lakehouse) -> None:
    """~25 MB of heap is one 64 MiB chunk by size, but two on two task slots (SNAP-01 speed)."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE wide (id int PRIMARY KEY, v text); INSERT INTO wide "
                    "SELECT g, repeat('w', 120) FROM generate_series(1, 150000) g; "
                    "ANALYZE wide")
        heap = table_size(pg_conn, "public", "wide").bytes
    assert 2 * PARALLEL_MIN_CHUNK_BYTES <= heap < 64 << 20
    assert int(spark.sparkContext.defaultParallelism) == 2
    sized = {"snapshot_chunk_bytes": 64 << 20, "include": ("public\\.wide",)}
    spread = run_snapshot(settings_for(pg_dsn, lakehouse, snapshot_max_threads=0,
                                       snapshot_spark_threshold_rows=0, **sized),
                          spark, force=True)
    assert spread.chunks_read == 2 and spread.rows_read == 150000
    keys = bronze_table(lakehouse, "wide").to_pyarrow_table(columns=["key"])["key"]
    assert sorted(k["id"] for k in keys.to_pylist()) == list(range(1, 150001))
    alone = run_snapshot(settings_for(pg_dsn, lakehouse / "one", slot="one", publication="one",
                                      snapshot_max_threads=1, **sized), spark, force=True)
    assert alone.chunks_read == 1 and alone.rows_read == 150000


def test_chunk_counts() -> None:
    mib = 1 << 20
    assert chunk_counts([], 64 * mib, 4) == []
    assert chunk_counts([0], 64 * mib, 4) == [1]
    assert chunk_counts([10 * mib], 64 * mib, 4) == [1]  # too small to spread
    assert chunk_counts([20 * mib], 64 * mib, 4) == [2]
    assert chunk_counts([50 * mib], 64 * mib, 4) == [4]
    assert chunk_counts([50 * mib], 64 * mib, 1) == [1]
    assert chunk_counts([1000 * mib], 64 * mib, 4) == [16]  # by size
    assert chunk_counts([50 * mib, 5 * mib], 64 * mib, 4) == [3, 1]  # the biggest first
    assert chunk_counts([20 * mib] * 100, 64 * mib, 2) == [1] * 100  # enough chunks already
    assert chunk_counts([93 * mib, 93 * mib], 64 * mib, 2) == [2, 2]
    # chunks of split tables in whole waves of the slots: 3 -> 4, 7 -> 8, 5 -> 8
    assert chunk_counts([140 * mib], 64 * mib, 2) == [4]
    assert chunk_counts([400 * mib], 64 * mib, 2) == [8]
    assert chunk_counts([300 * mib], 64 * mib, 4) == [8]
    assert chunk_counts([140 * mib, 20 * mib], 64 * mib, 2) == [4, 1]  # single chunks: as they are
    assert chunk_counts([20 * mib], 64 * mib, 3) == [2]  # chunks keep their minimum size


def _rows_per_chunk(conn, chunks, key) -> list[int]:
    with conn.cursor() as cur:
        out = []
        for chunk in chunks:
            cur.execute(chunk_query(chunk, ["id"], key))
            out.append(len(cur.fetchall()))
        return out


def test_key_chunks_from_the_histogram_hold_equal_rows(pg_conn) -> None:
    """A single bigint key's chunk boundaries come from its pg_stats histogram once ANALYZE
    made one: near-equal rows per chunk (a block sample of a table stored in key order
    gives 15-25 % apart), and every key in exactly one chunk, also once the statistics are
    stale; without statistics, and for a text key, the block sample still partitions."""
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE hist (id bigint PRIMARY KEY, pad text); "
                    "INSERT INTO hist SELECT g * 3, repeat('p', 50) "
                    "FROM generate_series(1, 60000) g; "
                    "CREATE TABLE plain (id text PRIMARY KEY); "
                    "INSERT INTO plain SELECT 'k' || g FROM generate_series(1, 20000) g")
    key = key_columns(pg_conn, "public", "hist")
    size = table_size(pg_conn, "public", "hist")
    sampled = plan_key_chunks(pg_conn, "public", "hist", key, 4, size)  # no statistics yet
    assert sum(_rows_per_chunk(pg_conn, sampled, key)) == 60000
    with pg_conn.cursor() as cur:
        cur.execute("ANALYZE hist; ANALYZE plain")
    chunks = plan_key_chunks(pg_conn, "public", "hist", key, 4, size)
    counts = _rows_per_chunk(pg_conn, chunks, key)
    assert len(chunks) == 4 and sum(counts) == 60000
    assert max(counts) - min(counts) < 60000 // 4 // 10, counts  # within 10 % of a chunk
    with pg_conn.cursor() as cur:  # stale statistics: new keys beyond the histogram
        cur.execute("INSERT INTO hist SELECT g * 3 + 1, 'x' FROM generate_series(1, 70000) g")
    stale = plan_key_chunks(pg_conn, "public", "hist", key, 4, size)
    assert [c.upper for c in stale] == [c.upper for c in chunks]
    assert sum(_rows_per_chunk(pg_conn, stale, key)) == 130000
    text_key = key_columns(pg_conn, "public", "plain")
    texts = plan_key_chunks(pg_conn, "public", "plain", text_key, 3,
                            table_size(pg_conn, "public", "plain"))
    assert sum(_rows_per_chunk(pg_conn, texts, text_key)) == 20000
