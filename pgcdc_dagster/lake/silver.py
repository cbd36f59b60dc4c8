"""Silver: current state per key, merged order-independently (design.md §3, decision 4).

Silver holds the source columns in native types plus ``__op``, ``__lsn`` (Debezium
``source.lsn``), ``__commit_lsn`` and ``__ordinal`` (the sequence: greatest wins),
``__source_ts_ms`` and ``__deleted``. A delete leaves a tombstone row (``__deleted = true``,
the key and whatever the old image held) so that a replayed older event cannot resurrect the
key; tombstones older than the retention are purged by the silver_maintenance job
(``lake/tombstones.py``). Read live rows with ``WHERE NOT __deleted``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import CommitFailedError

from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.column_versions import silver_values
from pgcdc_dagster.cdc.quoting import sql_ident
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.lake.data_files import DEFAULT_TARGET_FILE_BYTES
from pgcdc_dagster.lake.delta import commit_properties, ensure_table, load_table
from pgcdc_dagster.lake.evolution import evolve, with_table_metadata
from pgcdc_dagster.lake.silver_rewrite import apply_rewrite

META_FIELDS = (
    pa.field("__op", pa.string(), nullable=False),
    pa.field("__lsn", pa.int64()),
    pa.field("__commit_lsn", pa.int64(), nullable=False),
    pa.field("__ordinal", pa.int64(), nullable=False),
    pa.field("__source_ts_ms", pa.int64()),
    pa.field("__deleted", pa.bool_(), nullable=False),
)
META_NAMES = tuple(f.name for f in META_FIELDS)
TOAST_UNCHANGED = "__toast_unchanged"
"""The MERGE source's column listing, per row, the columns whose stored value is kept."""
COMMIT_ATTEMPTS = 3
"""Runs of a batch whose commit lost a race with a concurrent one (upkeep's compaction)."""


def silver_schema(relation: Relation, converters: Sequence[ColumnConverter]) -> pa.Schema:
    """Arrow schema of a silver table: native source columns, then metadata columns.

    A key column is NOT NULL when its source column is (every primary key); a nullable
    ``message.key.columns`` column stays nullable, and NULL is then one key value.
    """
    fields = [c.silver_field.with_nullable(c.silver_field.nullable or not col.is_key)
              for col, c in zip(relation.columns, converters, strict=True)]
    return pa.schema([*fields, *META_FIELDS])


def toastable_columns(relation: Relation, converters: Sequence[ColumnConverter]) -> list[str]:
    """Columns an update may leave out, so that silver keeps their stored value: those whose
    values can be stored out of line (variable-length, non-key), and under YugabyteDB's
    REPLICA IDENTITY CHANGE (``c``: an update carries only the key and the changed
    columns, YB-04/05) every non-key column."""
    out = []
    partial = relation.replica_identity == "c"
    for col, conv in zip(relation.columns, converters, strict=True):
        typ = conv.bronze_field.type
        fixed = pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ)
        if not col.is_key and (partial or not fixed):
            out.append(conv.bronze_field.name)
    return out


def silver_from_images(image: pa.StructArray, op: pa.Array, meta: dict[str, pa.Array],
                       relation: Relation, converters: Sequence[ColumnConverter]) -> pa.Table:
    """Silver rows from bronze images (after, or before for deletes) and event metadata."""
    schema = silver_schema(relation, converters)
    children = dict(zip([f.name for f in image.type], image.flatten(), strict=True))
    n = len(image)
    # Each event's value from the bronze field it was written to (a column whose type
    # changed has versioned fields, cdc/column_versions.py); null for a column added later.
    columns = [silver_values(conv, children, n) for conv in converters]
    deleted = pc.equal(op, "d")
    return pa.Table.from_arrays([
        *columns, op, meta["__lsn"], meta["__commit_lsn"], meta["__ordinal"],
        meta["__source_ts_ms"], deleted,
    ], schema=schema)


def merge_batch(uri: str, rows: pa.Table, toast_unchanged: pa.Array, *, relation: Relation,
                toastable: Sequence[str], app_id: str, version: int,
                truncate_seq: tuple[int, int] | None,
                metadata: dict[str, str] | None = None,
                target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES) -> dict[str, int]:
    """Apply one deduplicated batch to silver; record ``(app_id, version)`` in the last commit.

    A truncate in the batch first removes every row older than it. Then the batch is merged
    by rewriting only the files that hold changed keys (``lake/silver_rewrite.py``): a row
    is updated only when the incoming sequence is greater (replays are harmless), keeps the
    stored value of columns listed in ``__toast_unchanged``, and new keys are inserted.
    """
    table = ensure_table(uri, rows.schema)
    # A changed column type rewrites silver once; changed field metadata keeps the table's.
    rows = with_table_metadata(rows, evolve(table, rows.schema, f"silver {uri}",
                                            cast_changed=True))
    counts = {"deleted_by_truncate": 0, "inserted": 0, "updated": 0}
    props = commit_properties(app_id, version, metadata)
    if truncate_seq is not None:
        lsn, ordinal = truncate_seq
        lsn_col, ord_col = sql_ident("__commit_lsn"), sql_ident("__ordinal")
        truncated = table.delete(
            predicate=(f"{lsn_col} < {int(lsn)} OR "
                       f"({lsn_col} = {int(lsn)} AND {ord_col} < {int(ordinal)})"),
            commit_properties=props if rows.num_rows == 0 else None,
        )
        counts["deleted_by_truncate"] = int(truncated.get("num_deleted_rows", 0))
        if rows.num_rows == 0:
            return counts
    if rows.num_rows == 0:
        table.create_write_transaction([], "append", rows.schema, commit_properties=props)
        return counts
    keys = relation.key_names
    table.update_incremental()
    stored = pa.schema(table.schema().to_arrow())
    relaxed = [k for k in keys if rows.schema.field(k).nullable
               and stored.get_field_index(k) >= 0 and not stored.field(k).nullable]
    if relaxed:
        # The key column became nullable at the source (DROP NOT NULL), or the table was
        # written when silver declared every key NOT NULL.
        for k in relaxed:
            table.alter.drop_column_not_null(k)
        table.update_incremental()
        stored = pa.schema(table.schema().to_arrow())
    source = rows.append_column(TOAST_UNCHANGED, toast_unchanged)
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            result = apply_rewrite(table, uri, source, keys=keys, toastable=toastable,
                                   app_id=app_id, version=version, metadata=metadata,
                                   target_file_bytes=target_file_bytes)
            break
        except CommitFailedError:
            # A concurrent commit (upkeep's compaction) removed a file this batch rewrote:
            # nothing of the batch was committed; run it again on the new version.
            if attempt == COMMIT_ATTEMPTS:
                raise
            table.update_incremental()
    counts["inserted"] = result.inserted
    counts["updated"] = result.updated
    counts["files_read"] = result.files_read
    counts["files_removed"] = result.files_removed
    counts["bytes_removed"] = result.bytes_removed
    counts["files_added"] = len(result.added)
    counts["bytes_added"] = result.bytes_added
    return counts


def live_rows(uri: str) -> pa.Table:
    """The silver table without tombstones and metadata columns (the analyst's view)."""
    table = load_table(uri).to_pyarrow_table()
    live = table.filter(pc.invert(table["__deleted"]))
    return live.drop_columns(list(META_NAMES))
