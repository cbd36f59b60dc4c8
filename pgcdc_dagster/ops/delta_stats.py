"""Sizes and versions of Delta tables, for materialization metadata."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc_dagster.lake.delta import load_table, open_table


@dataclass(frozen=True, slots=True)
class TableStats:
    """A Delta table at one version: files, bytes and rows of its current snapshot."""

    version: int | None
    files: int = 0
    bytes: int = 0
    rows: int = 0
    paths: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Growth:
    """What the commits after a version added (files that are new in the later snapshot)."""

    files: int
    bytes: int
    rows: int


def table_stats(uri: str, version: int | None = None) -> TableStats:
    """Version, file count, bytes and rows (from the log's statistics) of the table now, or at
    ``version`` (an empty reading when the table, or that version, does not exist)."""
    table = open_table(uri)
    if table is None:
        return TableStats(None)
    if version is not None and version != table.version():
        try:
            table = load_table(uri, version)
        except Exception:  # vacuumed or recreated: nothing to compare with
            return TableStats(None)
    adds = pa.table(table.get_add_actions(flatten=True))
    rows = adds.column("num_records").to_pylist() if adds.num_rows else []
    return TableStats(
        version=table.version(),
        files=adds.num_rows,
        bytes=int(pc.sum(adds.column("size_bytes")).as_py() or 0) if adds.num_rows else 0,
        rows=sum(int(r or 0) for r in rows),
        paths=frozenset(adds.column("path").to_pylist()) if adds.num_rows else frozenset(),
    )


def growth(before: TableStats, after: TableStats, uri: str) -> Growth:
    """Files, bytes and rows the table gained between two readings (rewrites count too)."""
    if after.version is None or before.version == after.version:
        return Growth(0, 0, 0)
    if before.version is None:  # nothing before (the first materialization): all is new
        return Growth(after.files, after.bytes, after.rows)
    table = load_table(uri, after.version)
    adds = pa.table(table.get_add_actions(flatten=True))
    new = [i for i, p in enumerate(adds.column("path").to_pylist()) if p not in before.paths]
    if not new:
        return Growth(0, 0, 0)
    picked = adds.take(pa.array(new, pa.int64()))
    return Growth(
        files=len(new),
        bytes=int(pc.sum(picked.column("size_bytes")).as_py() or 0),
        rows=sum(int(r or 0) for r in picked.column("num_records").to_pylist()),
    )


def live_row_count(uri: str) -> int | None:
    """Rows of a silver table that are not tombstones (``WHERE NOT __deleted``).

    From the files' statistics when they decide every file (no tombstone in a file whose
    ``__deleted`` maximum is false, only tombstones and nulls in one whose minimum is true:
    a snapshot's silver, most tables most of the time); otherwise the column is read."""
    table = open_table(uri)
    if table is None:
        return None
    known = _live_from_stats(pa.table(table.get_add_actions(flatten=True)))
    if known is not None:
        return known
    return int(table.to_pyarrow_dataset().count_rows(filter=~pc.field("__deleted")))


def _live_from_stats(adds: pa.Table) -> int | None:
    """Live rows by the add actions' ``__deleted`` statistics; None when a file's are
    missing or mixed (it holds live rows and tombstones)."""
    if adds.num_rows == 0:
        return 0
    names = ("num_records", "null_count.__deleted", "min.__deleted", "max.__deleted")
    if any(n not in adds.column_names for n in names):
        return None
    live = 0
    for rows, nulls, low, high in zip(*(adds.column(n).to_pylist() for n in names),
                                      strict=True):
        if rows is None or nulls is None:
            return None
        if rows == nulls or low is True:  # every value null or a tombstone
            continue
        if high is not False:  # mixed (or no bounds): the column must be read
            return None
        live += rows - nulls
    return live
