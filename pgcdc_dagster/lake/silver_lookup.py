"""Unchanged-TOAST values of moved rows, read from silver (STR-46..52, IMP-06).

An UPDATE that changes the primary key under REPLICA IDENTITY DEFAULT arrives as a delete
of the old key and a create of the new key whose unchanged TOAST columns hold the
placeholder. When the batch itself does not hold the old key's value (``cdc/silver_batch``
walks the old key's earlier events first), the value is the old key's stored silver row,
provided that row is live and older than the key change. When nothing holds it, the
placeholder is stored and a warning names table, key and column.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.dataset as ds

from pgcdc_dagster.cdc.changes import Relation
from pgcdc_dagster.cdc.silver_batch import SilverLookup
from pgcdc_dagster.cdc.silver_values import from_bronze
from pgcdc_dagster.cdc.typeconv import ColumnConverter
from pgcdc_dagster.lake.delta import load_table

log = logging.getLogger(__name__)


def _native_keys(keys: Sequence[tuple[object, ...]], relation: Relation,
                 converters: Sequence[ColumnConverter]) -> list[tuple[object, ...]]:
    """Key tuples in bronze encoding -> the same keys in silver's native values."""
    by_name = {c.bronze_field.name: c for c in converters}
    columns = []
    for i, name in enumerate(relation.key_names):
        conv = by_name[name]
        bronze = pa.array([k[i] for k in keys], conv.bronze_field.type)
        columns.append(from_bronze(conv, bronze).to_pylist())
    return list(zip(*columns, strict=True)) if columns else []


def _stored_rows(uri: str, relation: Relation, keys: list[tuple[object, ...]]
                 ) -> dict[tuple[object, ...], dict[str, object]]:
    """Silver rows of the given (native) keys, by key."""
    table = load_table(uri)  # apply_silver created it before the batch
    names = relation.key_names
    expr = None
    for i, name in enumerate(names):
        cond = ds.field(name).isin(sorted({k[i] for k in keys}, key=repr))
        expr = cond if expr is None else expr & cond
    data = table.to_pyarrow_dataset().to_table(filter=expr)
    wanted = set(keys)
    out: dict[tuple[object, ...], dict[str, object]] = {}
    for row in data.to_pylist():
        key = tuple(row[n] for n in names)
        if key in wanted:
            out[key] = row
    return out


def resolve_lookups(uri: str, rows: pa.Table, toast_unchanged: pa.Array,
                    lookups: Sequence[SilverLookup], *, relation: Relation,
                    converters: Sequence[ColumnConverter], silver_names: Mapping[str, str],
                    table: str) -> tuple[pa.Table, pa.Array]:
    """Fill the looked-up columns of ``rows`` (silver rows of a prepared batch).

    Every looked-up column leaves the row's ``__toast_unchanged`` list: the MERGE then
    writes the filled value, or the placeholder when none was found.
    """
    if not lookups:
        return rows, toast_unchanged
    wanted = sorted({lk.old_key for lk in lookups if lk.old_key is not None}, key=repr)
    native = dict(zip(wanted, _native_keys(wanted, relation, converters), strict=True))
    stored = _stored_rows(uri, relation, list(native.values())) if native else {}
    unchanged = toast_unchanged.to_pylist()
    columns: dict[str, list[object]] = {}
    for lk in lookups:
        col = silver_names.get(lk.column, lk.column)
        values = columns.get(col)
        if values is None:
            values = columns[col] = rows.column(col).to_pylist()
        row = stored.get(native[lk.old_key]) if lk.old_key is not None else None
        seq = (row["__commit_lsn"], row["__ordinal"]) if row is not None else None
        if row is not None and not row["__deleted"] and seq is not None and seq < lk.before:
            values[lk.row] = row[col]
        elif not (row is not None and seq is not None and seq >= lk.before):
            # (A stored row as new as the key change means this batch was applied before:
            # the new key's row is not older either, so the MERGE leaves it as it is.)
            key = {n: rows.column(n)[lk.row].as_py() for n in relation.key_names}
            log.warning(
                "%s: no value for unchanged TOAST column %s of key %s after a primary-key "
                "change (REPLICA IDENTITY DEFAULT sends no old value and silver holds none): "
                "the placeholder is stored; REPLICA IDENTITY FULL avoids this",
                table, col, key)
        names = unchanged[lk.row]
        if names is not None and lk.column in names:
            names.remove(lk.column)
        if names is not None and col in names:
            names.remove(col)
    for col, values in columns.items():
        idx = rows.schema.get_field_index(col)
        field = rows.schema.field(idx)
        rows = rows.set_column(idx, field, pa.array(values, field.type))
    cleaned = [None if not u else u for u in unchanged]
    return rows, pa.array(cleaned, pa.list_(pa.string()))

