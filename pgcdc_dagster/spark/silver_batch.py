"""Preparing a silver batch in Spark: the latest event per key, TOAST gaps filled in.

Input is the bronze Parquet files appended since silver last caught up. Output (as Arrow)
holds one row per key: the event with the greatest sequence ``(__commit_lsn, __ordinal)``;
for columns that event left unchanged (TOAST), the newest earlier value of the same key in
the batch fills the gap when there is one, otherwise the column stays listed in
``__toast_unchanged`` so the MERGE keeps the stored value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pgcdc_dagster.cdc.silver_batch import PreparedBatch

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession


def _seq(df_col: str = "") -> list[SparkColumn]:
    from pyspark.sql import functions as F

    return [F.col(f"{df_col}__commit_lsn"), F.col(f"{df_col}__ordinal")]


def prepare(spark: SparkSession, files: Sequence[str], key_columns: Sequence[str],
            toastable: Sequence[str]) -> PreparedBatch:
    """Read bronze files and reduce them to one row per key (see module docstring)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # Files written before and after a schema change differ: merge their schemas.
    bronze: DataFrame = spark.read.option("mergeSchema", "true").parquet(*files)
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
        *[F.col(f"key.{k}").alias(f"__k_{i}") for i, k in enumerate(key_columns)],
    )
    keys = [f"__k_{i}" for i in range(len(key_columns))]
    ordered = Window.partitionBy(*keys).orderBy(*_seq())
    upto = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    fills = {}
    for col in toastable:
        flagged = F.array_contains(F.coalesce("__toast_unchanged", F.array().cast("array<string>")),
                                   col)
        known = F.when(~flagged & (F.col("op") != "d"), F.struct(F.col(f"image.{col}").alias("v")))
        fills[col] = F.last(known, ignorenulls=True).over(upto)
    rows = rows.withColumn("__rank", F.row_number().over(
        Window.partitionBy(*keys).orderBy(*[c.desc() for c in _seq()])))
    for col, expr in fills.items():
        rows = rows.withColumn(f"__fill_{col}", expr)
    latest = rows.where(F.col("__rank") == 1)
    if toastable:
        image_fields = [f.name for f in bronze.schema["after"].dataType.fields]  # type: ignore[attr-defined]
        patched = []
        for name in image_fields:
            if name in fills:
                patched.append(F.when(F.col(f"__fill_{name}").isNotNull(),
                                      F.col(f"__fill_{name}.v"))
                               .otherwise(F.col(f"image.{name}")).alias(name))
            else:
                patched.append(F.col(f"image.{name}").alias(name))
        still = F.filter(F.coalesce("__toast_unchanged", F.array().cast("array<string>")),
                         lambda c: _not_filled(c, list(fills)))
        latest = latest.select(
            F.when(F.col("image").isNull(), F.lit(None)).otherwise(F.struct(*patched))
            .alias("image"),
            "op", "__commit_lsn", "__ordinal", "__lsn", "__source_ts_ms",
            F.when(F.size(still) > 0, still).alias("__toast_unchanged"),
        )
    else:
        latest = latest.select("image", "op", "__commit_lsn", "__ordinal", "__lsn",
                               "__source_ts_ms", "__toast_unchanged")
    table = latest.toArrow()
    return PreparedBatch(table, truncate_seq, events)


def _not_filled(col: SparkColumn, filled: list[str]) -> SparkColumn:
    """Element filter for ``__toast_unchanged``: keep names whose gap no event filled."""
    from pyspark.sql import functions as F

    cond = F.lit(True)
    for name in filled:
        cond = cond & ~((col == name) & F.col(f"__fill_{name}").isNotNull())
    return cond
