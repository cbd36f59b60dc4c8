"""Snapshot reads: what a chunk is, its query, and the session its reader runs in.

Planning is :mod:`~pgcdc_dagster.postgres.chunk_plan`'s, overrides are checked by
:mod:`~pgcdc_dagster.postgres.snapshot_override`, consistent points are
:mod:`~pgcdc_dagster.postgres.exported_snapshot`'s.

Chunks (design.md §3, decision 7):

* **key ranges** for every table with a key (every captured table has one: a primary key or a
  replica identity index, both btree, NOT NULL and unique). Boundaries are equal-width
  ranges between min and max for a single integer key, otherwise quantiles of a
  ``TABLESAMPLE SYSTEM`` sample; composite keys use row-value comparison
  ``(a, b) >= (x, y) AND (a, b) < (z, w)``, which follows the key index. A key belongs to
  exactly one range whatever happens to its row, which is what lets an interrupted snapshot
  finish its remaining ranges at a later consistent point (see ``capture/snapshot.py``).
* **CTID block ranges** (``ctid >= '(a,0)' AND ctid < '(b,0)'``, a TID range scan) when no key
  can be used. An update may move a row to another block, so CTID chunks are only consistent
  when all of them are read in the same snapshot.

Reading is :mod:`pgcdc_dagster.postgres.arrow_reader`'s (ADBC, Arrow record batches). Every
reader transaction pins the session settings the text converters expect
(:data:`SESSION_SETTINGS`: ISO dates, ``postgres`` intervals, UTC, shortest exact floats, hex
bytea), so a column read as text equals what pgoutput would send under the same settings.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from pgcdc_dagster.exceptions import ConfigurationError, PgCdcError

CSV_BLOCK_BYTES = 1 << 20
"""Default reader batch: about ``snapshot.fetch.size`` rows of a typical table."""
MIN_BLOCK_BYTES = 128 << 10
MAX_BLOCK_BYTES = 1 << 20
"""Reader batches are gathered into row groups (``row_group_bytes``) before conversion."""

SESSION_SETTINGS: tuple[tuple[str, str], ...] = (
    ("client_encoding", "UTF8"),
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("TimeZone", "UTC"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
)
"""``SET LOCAL`` in every snapshot transaction: the text forms the converters parse."""


class TableVanishedError(ConfigurationError):
    """A captured table (or one of its columns) disappeared after the snapshot was planned."""


class SnapshotExpiredError(PgCdcError):
    """The exported snapshot is gone (its replication connection closed)."""


@dataclass(frozen=True, slots=True)
class KeyColumn:
    """One key column, in key-index order, with the SQL type its boundary literals cast to."""

    name: str
    sql_type: str


@dataclass(frozen=True, slots=True)
class Chunk:
    """One unit of snapshot work: a key range or a CTID block range of one table.

    Key ranges are ``[lower, upper)`` over the key columns (text values cast to the key
    types); ``None`` is open. CTID ranges are ``[start_block, end_block)`` blocks.
    """

    schema: str
    table: str
    index: int
    kind: str = "key"
    """``key`` or ``ctid``."""
    lower: tuple[str, ...] | None = None
    upper: tuple[str, ...] | None = None
    start_block: int = 0
    end_block: int | None = None

    @property
    def qualified(self) -> tuple[str, str]:
        return (self.schema, self.table)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind,
                "lower": None if self.lower is None else list(self.lower),
                "upper": None if self.upper is None else list(self.upper),
                "start_block": self.start_block, "end_block": self.end_block}

    @classmethod
    def from_json(cls, schema: str, table: str, data: dict[str, Any]) -> Chunk:
        lower, upper = data.get("lower"), data.get("upper")
        return cls(schema, table, int(data["index"]), str(data["kind"]),
                   None if lower is None else tuple(lower),
                   None if upper is None else tuple(upper),
                   int(data.get("start_block") or 0),
                   None if data.get("end_block") is None else int(data["end_block"]))

    def __str__(self) -> str:
        if self.kind == "ctid":
            end = "" if self.end_block is None else str(self.end_block)
            span = f"blocks [{self.start_block}, {end})"
        else:
            lo = "-inf" if self.lower is None else ",".join(self.lower)
            hi = "+inf" if self.upper is None else ",".join(self.upper)
            span = f"keys [{lo}, {hi})"
        return f"{self.schema}.{self.table}#{self.index} {span}"


def set_timeout(cur: psycopg2.extensions.cursor, timeout_ms: int) -> None:
    """``SET LOCAL statement_timeout`` (0: none) in the current transaction."""
    cur.execute("SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout_ms)}ms",))


def timed_out(exc: psycopg2.Error, label: str, timeout_ms: int) -> PgCdcError:
    """The error for a statement cancelled by ``statement_timeout``, naming the setting."""
    message = (exc.pgerror or str(exc)).strip().splitlines()[0]
    return PgCdcError(timed_out_message(label, message, timeout_ms))


def timed_out_message(label: str, message: str, timeout_ms: int) -> str:
    """What to say about a statement cancelled by ``statement_timeout``."""
    return (
        f"{label}: {message} (statement_timeout {timeout_ms} ms). A statement that runs an "
        "additional-conditions filter or a snapshot.select.statement.overrides SELECT is "
        "cancelled after PGCDC_INCREMENTAL_STATEMENT_TIMEOUT_MS; make the filter cheaper (a "
        "condition an index serves, a smaller incremental.snapshot.chunk.size) or raise the "
        "setting, then run again (chunks already committed are kept).")


def set_session(cur: psycopg2.extensions.cursor, *, local: bool = True) -> None:
    """Pin the text output settings the converters expect (``SET LOCAL`` by default)."""
    scope = "SET LOCAL" if local else "SET"
    for name, value in SESSION_SETTINGS:
        cur.execute(sql.SQL(scope + " {} = {}").format(sql.Identifier(name),
                                                       sql.Literal(value)))


# --- queries -----------------------------------------------------------------------------

def _row(values: Sequence[str], key: Sequence[KeyColumn]) -> sql.Composable:
    items = [sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(k.sql_type))
             for v, k in zip(values, key, strict=True)]
    return sql.SQL("({})").format(sql.SQL(", ").join(items))


BYTE_ORDER_TYPES = re.compile(r"^(text|name|citext|character varying|character|varchar|"
                              r"bpchar)(\(\d+\))?$")
"""Key types ``ORDER BY`` sorts with ``COLLATE "C"`` (code point order, the order of the
strings silver's file statistics compare) instead of the column's collation."""


def chunk_query(chunk: Chunk, columns: Sequence[str], key: Sequence[KeyColumn] = (),
                override: str | None = None, *, ordered: bool = False) -> sql.Composed:
    """The chunk's ``SELECT``: the table (or the validated override) restricted to the chunk;
    ``ordered``: a key chunk's rows in key order (text keys in code point order), for silver
    files laid out by key (``spark/snapshot_tasks.py``).

    Key types come from the catalog (``format_type``), never from user input; an override
    has been validated as a single read-only SELECT by :func:`validate_override`.
    """
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    source: sql.Composable = sql.Identifier(chunk.schema, chunk.table)
    if override is not None:
        source = sql.SQL("({}) AS _pgcdc_override").format(sql.SQL(override))
    cond: list[sql.Composable] = []
    if chunk.kind == "ctid":
        if override is not None:
            raise ConfigurationError(f"{chunk}: a SELECT override cannot be split by CTID")
        cond.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({chunk.start_block},0)")))
        if chunk.end_block is not None:
            cond.append(sql.SQL("ctid < {}::tid").format(
                sql.Literal(f"({chunk.end_block},0)")))
    else:
        names = sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(k.name) for k in key))
        if chunk.lower is not None:
            cond.append(sql.SQL("{} >= {}").format(names, _row(chunk.lower, key)))
        if chunk.upper is not None:
            cond.append(sql.SQL("{} < {}").format(names, _row(chunk.upper, key)))
    query = sql.SQL("SELECT {} FROM {}").format(cols, source)
    if cond:
        query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(cond))
    if ordered and chunk.kind != "ctid" and key:
        query = sql.SQL("{} ORDER BY {}").format(query, sql.SQL(", ").join(
            sql.SQL('{} COLLATE "C"' if BYTE_ORDER_TYPES.match(k.sql_type) else "{}").format(
                sql.Identifier(k.name)) for k in key))
    return query


# --- reading -----------------------------------------------------------------------------

def block_bytes(fetch_size: int, row_bytes: int) -> int:
    """Reader batch for ``snapshot.fetch.size`` rows of about ``row_bytes`` bytes.

    The Arrow reader streams a COPY, so the fetch size cannot bound a network round trip as
    it does for Debezium's JDBC cursor; it sizes the batches the reader builds, within
    [``MIN_BLOCK_BYTES``, ``MAX_BLOCK_BYTES``] so memory stays bounded.
    """
    return max(MIN_BLOCK_BYTES, min(MAX_BLOCK_BYTES, fetch_size * max(row_bytes, 1)))
