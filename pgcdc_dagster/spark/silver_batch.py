"""Preparing a silver batch in Spark: the latest event per key, TOAST gaps filled in.

Input is the bronze Parquet files appended since silver last caught up. Output (as Arrow)
holds one row per key: the event with the greatest sequence ``(__commit_lsn, __ordinal)``;
for columns that event left unchanged (TOAST), the newest earlier value of the same key in
the batch fills the gap when there is one, otherwise the column stays listed in
``__toast_unchanged`` so the MERGE keeps the stored value. Values are never taken from
before a delete (a key's life starts at its create); a create whose gap remains is a
primary-key change, resolved from the old key as ``cdc/silver_batch.py`` describes (the
few rows involved are collected and resolved on the driver).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from pgcdc_dagster.cdc.quoting import spark_path
from pgcdc_dagster.cdc.silver_batch import OUTPUT_COLUMNS, PreparedBatch, SilverLookup

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession


def _seq(df_col: str = "") -> list[SparkColumn]:
    from pyspark.sql import functions as F

    return [F.col(f"{df_col}__commit_lsn"), F.col(f"{df_col}__ordinal")]


class _RemoteReader:
    """``mapInArrow`` function: each executor reads its share of the files through pyarrow's
    own filesystem (no Hadoop S3 connector needed), conformed to the table's schema."""

    def __init__(self, schema: pa.Schema, storage: dict[str, str] | None) -> None:
        self.schema = schema
        self.storage = storage

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        from pgcdc_dagster.lake.bronze_read import conform_table
        from pgcdc_dagster.lake.storage import filesystem

        for batch in batches:
            for path in batch.column(0).to_pylist():
                fs, inner = filesystem(path, self.storage)
                with fs.open_input_file(inner) as handle:
                    parquet = pq.ParquetFile(handle)
                    present = set(parquet.schema_arrow.names)
                    names = [n for n in self.schema.names if n in present]
                    for group in parquet.iter_batches(columns=names):
                        yield from conform_table(pa.Table.from_batches([group]),
                                                 self.schema).to_batches()


def read_bronze(spark: SparkSession, files: Sequence[str], schema: pa.Schema | None = None,
                storage: dict[str, str] | None = None) -> DataFrame:
    """The bronze files as a DataFrame under ``schema`` (the table's, or the part of it
    read): a column a file lacks reads as null, as Delta readers read it (a field added
    after the file was written; the all-null columns a snapshot file leaves out,
    ``capture/snapshot_convert.py``). Local files: Spark's Parquet reader, given the schema.
    Object-store files: read on the executors through pyarrow. Without ``schema`` (local
    files only): the files' schemas merged."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from pgcdc_dagster.lake.paths import is_local

    if schema is None:
        return spark.read.option("mergeSchema", "true").parquet(*files)
    if all(is_local(f) for f in files):
        return spark.read.schema(from_arrow_schema(schema)).parquet(*files)
    spread = max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or 1))
    paths = spark.createDataFrame([(f,) for f in files], "path string") \
        .repartition(min(len(files), spread))
    return paths.mapInArrow(_RemoteReader(schema, storage), from_arrow_schema(schema))


def prepare(spark: SparkSession, files: Sequence[str], key_columns: Sequence[str],
            toastable: Sequence[str], schema: pa.Schema | None = None,
            storage: dict[str, str] | None = None) -> PreparedBatch:
    """Read bronze files and reduce them to one row per key (see module docstring).

    ``schema`` (the bronze table's, restricted to what is read) and ``storage`` (its storage
    options) are needed for files on object storage; see :func:`read_bronze`.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    bronze: DataFrame = read_bronze(spark, files, schema, storage)
    events = bronze.count()
    trunc = (bronze.where(F.col("op") == "t")
             .agg(F.max(F.struct(*_seq())).alias("m")).collect()[0]["m"])
    truncate_seq = (int(trunc[0]), int(trunc[1])) if trunc is not None else None
    rows = bronze.where(F.col("op").isin("c", "u", "d", "r"))
    if truncate_seq is not None:
        lsn, ordinal = truncate_seq
        rows = rows.where((F.col("__commit_lsn") > lsn)
                          | ((F.col("__commit_lsn") == lsn) & (F.col("__ordinal") > ordinal)))
    rows = rows.select(
        F.when(F.col("op") == "d", F.col("before")).otherwise(F.col("after")).alias("image"),
        "op", "__commit_lsn", "__ordinal",
        F.col("source.lsn").alias("__lsn"), F.col("source.ts_ms").alias("__source_ts_ms"),
        "__toast_unchanged",
        *[F.col(spark_path("key", k)).alias(f"__k_{i}") for i, k in enumerate(key_columns)],
    )
    keys = [f"__k_{i}" for i in range(len(key_columns))]
    ordered = Window.partitionBy(*keys).orderBy(*_seq())
    upto = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    # A key's life: events since its latest create (a delete belongs to the life it ends).
    rows = rows.withColumn("__life", F.sum(F.when(F.col("op").isin("c", "r"), 1)
                                          .otherwise(0)).over(upto))
    in_life = Window.partitionBy(*keys, "__life").orderBy(*_seq()).rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    # Fill columns are numbered, never named after a source column (whose name may hold
    # dots or backticks, or equal another's but for case: Spark resolves names without case).
    fill_of = {col: _fill(i) for i, col in enumerate(toastable)}
    fills = {}
    for col in toastable:
        flagged = F.array_contains(F.coalesce("__toast_unchanged", F.array().cast("array<string>")),
                                   F.lit(col))
        known = F.when(~flagged & (F.col("op") != "d"),
                       F.struct(F.col(spark_path("image", col)).alias("v")))
        fills[col] = F.last(known, ignorenulls=True).over(in_life)
    rows = rows.withColumn("__rank", F.row_number().over(
        Window.partitionBy(*keys).orderBy(*[c.desc() for c in _seq()])))
    rows = rows.withColumn("__life_lsn", F.first("__commit_lsn").over(in_life)) \
        .withColumn("__life_ordinal", F.first("__ordinal").over(in_life))
    for col, expr in fills.items():
        rows = rows.withColumn(fill_of[col], expr)
    latest = rows.where(F.col("__rank") == 1)
    move_cols = ["__life", "__life_lsn", "__life_ordinal", *keys]
    if toastable:
        image_fields = [f.name for f in bronze.schema["after"].dataType.fields]  # type: ignore[attr-defined]
        patched = []
        for name in image_fields:
            if name in fills:
                patched.append(F.when(F.col(fill_of[name]).isNotNull(),
                                      F.col(spark_path(fill_of[name], "v")))
                               .otherwise(F.col(spark_path("image", name))).alias(name))
            else:
                patched.append(F.col(spark_path("image", name)).alias(name))
        still = F.filter(F.coalesce("__toast_unchanged", F.array().cast("array<string>")),
                         lambda c: _not_filled(c, fill_of))
        latest = latest.select(
            F.when(F.col("image").isNull(), F.lit(None)).otherwise(F.struct(*patched))
            .alias("image"),
            "op", "__commit_lsn", "__ordinal", "__lsn", "__source_ts_ms",
            F.when(F.size(still) > 0, still).alias("__toast_unchanged"), *move_cols,
        )
    else:
        latest = latest.select("image", "op", "__commit_lsn", "__ordinal", "__lsn",
                               "__source_ts_ms", "__toast_unchanged", *move_cols)
    table = latest.toArrow()
    lookups: tuple[SilverLookup, ...] = ()
    if toastable:
        table, lookups = _resolve_moves(rows, table, keys, fill_of)
    return PreparedBatch(table.select(list(OUTPUT_COLUMNS)), truncate_seq, events, lookups)


def _fill(index: int) -> str:
    """The batch column holding the newest known value of the index-th TOAST-able column."""
    return f"__fill_{index}"


def _resolve_moves(rows: DataFrame, table: pa.Table, keys: list[str], fill_of: dict[str, str]
                   ) -> tuple[pa.Table, tuple[SilverLookup, ...]]:
    """Fill the gaps of winners whose life began with a key change in this batch.

    Such a winner's value is the old key's just before the change: the fill at the old
    key's delete (same sequence, another key); when that is empty and the old key's life
    began with a key change too, the walk goes on through that one; when the old key's life
    began before the batch, silver's row of the old key holds it (a lookup).
    """
    from pyspark.sql import functions as F

    unchanged = table["__toast_unchanged"].to_pylist()
    lives = table["__life"].to_pylist()
    moved = [i for i, gaps in enumerate(unchanged) if gaps and lives[i]]
    if not moved:
        return table, ()
    # The creates of key changes with a gap and the deletes at their sequences (few rows).
    has_gap = F.size(F.coalesce("__toast_unchanged", F.array().cast("array<string>"))) > 0
    seqs = rows.where((F.col("op") == "c") & has_gap).select("__commit_lsn", "__ordinal")
    partners = (rows.where(F.col("op") == "d").join(seqs, ["__commit_lsn", "__ordinal"])
                .select("__commit_lsn", "__ordinal", "__life", "__life_lsn", "__life_ordinal",
                        *keys, *fill_of.values()).toArrow().to_pylist())
    by_seq: dict[tuple[int, int], list[dict[str, object]]] = {}
    for d in partners:
        by_seq.setdefault((int(d["__commit_lsn"]), int(d["__ordinal"])), []).append(d)
    images = table["image"].to_pylist()
    lookups: list[SilverLookup] = []
    for i in moved:
        key = tuple(table[k][i].as_py() for k in keys)
        start = (int(table["__life_lsn"][i].as_py()), int(table["__life_ordinal"][i].as_py()))
        left = list(unchanged[i] or [])
        image = dict(images[i] or {})
        for col in [c for c in left if c in fill_of]:
            kind, value, old, seq = _walk(by_seq, keys, fill_of[col], key, start)
            if kind == "found":
                image[col] = value
                left.remove(col)
            else:
                lookups.append(SilverLookup(i, col, old if kind == "before" else None, seq))
        images[i] = image
        unchanged[i] = left or None
    table = table.set_column(table.schema.get_field_index("image"), "image",
                             pa.array(images, table.schema.field("image").type))
    table = table.set_column(table.schema.get_field_index("__toast_unchanged"),
                             "__toast_unchanged", pa.array(unchanged, pa.list_(pa.string())))
    return table, tuple(lookups)


def _walk(by_seq: dict[tuple[int, int], list[dict[str, object]]], names: list[str], fill: str,
          key: tuple[object, ...], start: tuple[int, int]
          ) -> tuple[str, object, tuple[object, ...] | None, tuple[int, int]]:
    """Follow key changes back from a life that began at ``start`` (a create with a gap);
    ``fill`` is the column's fill column."""
    for _ in range(64):
        partner = next((d for d in by_seq.get(start, [])
                        if tuple(d[k] for k in names) != key), None)
        if partner is None:
            return "nowhere", None, None, start
        value = partner[fill]
        if isinstance(value, dict):  # a struct: its value may itself be NULL
            return "found", value["v"], None, start
        old = tuple(partner[k] for k in names)
        if not partner["__life"]:  # the old key's life began before the batch
            return "before", None, old, start
        key = old
        start = (int(partner["__life_lsn"]), int(partner["__life_ordinal"]))  # type: ignore[call-overload]
    return "nowhere", None, None, start


def _not_filled(col: SparkColumn, fill_of: dict[str, str]) -> SparkColumn:
    """Element filter for ``__toast_unchanged``: keep names whose gap no event filled."""
    from pyspark.sql import functions as F

    cond = F.lit(True)
    for name, fill in fill_of.items():
        cond = cond & ~((col == F.lit(name)) & F.col(fill).isNotNull())
    return cond
