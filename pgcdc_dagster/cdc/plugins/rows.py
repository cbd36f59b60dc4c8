"""Another plugin's changes written straight into the pgoutput assembler, as decoded rows.

A translator (wal2json, decoderbufs) hands each change to :class:`RowOutput` by table and
column name (or, on its fast paths, as ready tuples). Inserts, updates and deletes go to
:meth:`Assembler.decoded_change
<pgcdc_dagster.cdc.pgoutput.assembler.Assembler.decoded_change>` as the rows the pgoutput
decoder would have parsed out of the message (``pgwire.row_of`` / ``pgwire.old_image``: the
same tuple rules), so no pgoutput message is encoded and parsed again for them; Begin,
Commit, Truncate and logical decoding messages, a few per transaction, are fed as pgoutput
messages (:mod:`.pgwire`). A table's Relation is applied before its first change of the
window. Everything after the assembler (the Window, bronze, silver) is the same code as for
pgoutput.
"""

from __future__ import annotations

from collections.abc import Mapping

from pgcdc_dagster.cdc.changes import Row
from pgcdc_dagster.cdc.pgoutput.assembler import Assembler
from pgcdc_dagster.cdc.plugins.pgwire import TableInfo, Value, old_image, row_of, truncate

INSERT, UPDATE, DELETE = 0x49, 0x55, 0x44
"""Change codes (pgoutput's message type bytes)."""


class RowOutput:
    """One window's changes from another plugin, into ``assembler``."""

    def __init__(self, tables: Mapping[tuple[str, str], TableInfo],
                 assembler: Assembler) -> None:
        self.tables = tables
        self.assembler = assembler
        self.feed = assembler.feed
        """``feed(lsn, pgoutput message)``: Begin, Commit, Truncate, messages."""
        self._described: set[int] = set()

    def info(self, schema: str, table: str) -> TableInfo | None:
        """The table's description; None for a table that is not captured."""
        return self.tables.get((schema, table))

    def describe(self, info: TableInfo) -> int:
        """Apply the table's Relation (once per window); its oid."""
        oid = info.relation.oid
        if oid not in self._described:
            self._described.add(oid)
            self.assembler.relation(info.relation)
        return oid

    def row(self, lsn: int, code: int, info: TableInfo, before: Row | None, key_only: bool,
            after: Row | None) -> None:
        """A change given as the tuples pgoutput would send (see ``Assembler.decoded_change``).

        Raises:
            DecodeError: outside a transaction.
        """
        oid = info.relation.oid
        if oid not in self._described:
            self.describe(info)
        self.assembler.decoded_change(lsn, code, oid, before, key_only, after)

    def insert(self, lsn: int, info: TableInfo, new: Mapping[str, Value]) -> None:
        """An insert of ``new`` (column name -> value)."""
        self.row(lsn, INSERT, info, None, False, row_of(info, new, toast=False))

    def update(self, lsn: int, info: TableInfo, new: Mapping[str, Value],
               old: Mapping[str, Value] | None) -> None:
        """An update, with the old tuple pgoutput would send for ``old``."""
        before, key_only = old_image(info, new, old)
        self.row(lsn, UPDATE, info, before, key_only, row_of(info, new, toast=True))

    def delete(self, lsn: int, info: TableInfo, old: Mapping[str, Value]) -> None:
        """A delete of the old key (or the whole old row, REPLICA IDENTITY FULL)."""
        before, key_only = old_image(info, None, old)
        self.row(lsn, DELETE, info, before, key_only, None)

    def truncate(self, lsn: int, infos: list[TableInfo]) -> None:
        """One Truncate of ``infos`` (no CASCADE / RESTART IDENTITY flags)."""
        for info in infos:
            self.describe(info)
        self.feed(lsn, truncate([i.relation.oid for i in infos]))
