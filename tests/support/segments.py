"""Hand-made change segments and table contexts for silver tests (int4/text relations).

The silver tests build bronze through the real bronze writer from these segments, then apply
it with the real ``apply_silver``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from pgcdc_dagster.capture.tables import TableContext
from pgcdc_dagster.cdc.changes import Relation, TableChanges
from pgcdc_dagster.cdc.envelope import SourceIdentity
from pgcdc_dagster.cdc.typeconv import PgType, TypeModes, converter_for
from pgcdc_dagster.lake.paths import table_uri

INT4 = PgType(23, "pg_catalog", "int4", "b", "N")
TEXT = PgType(25, "pg_catalog", "text", "b", "S")
IDENT = SourceIdentity("test", "db")
_TYPES = {23: INT4, 25: TEXT}


def text_context(lakehouse: object, rel: Relation, *, not_null: Collection[str] = (),
                 app: str = "t:silver") -> TableContext:
    """The context of ``rel`` (int4/text columns) under ``<lakehouse>/{bronze,silver}``."""
    modes = TypeModes()
    convs = tuple(
        converter_for(c.name, _TYPES[c.type_oid], -1, modes, nullable=c.name not in not_null)
        for c in rel.columns)
    return TableContext(rel, convs, table_uri(str(lakehouse), "bronze", "public", rel.name),
                        table_uri(str(lakehouse), "silver", "public", rel.name),
                        "t:bronze", app)


class SegmentBuilder:
    """Builds a TableChanges segment; each :meth:`add` is one event in its own transaction
    (commit LSN 10 past the previous one, change LSN 5 below its commit)."""

    def __init__(self, rel: Relation, lsn: int = 1000,
                 encode: Callable[[tuple], tuple] | None = None) -> None:
        self.seg = TableChanges(rel)
        self.lsn = lsn
        self._encode = encode or (lambda row: row)

    def add(self, op: str, before: tuple | None = None, after: tuple | None = None,
            key_only: bool = False) -> SegmentBuilder:
        self.lsn += 10
        s = self.seg
        s.op.append(op)
        s.commit_lsn.append(self.lsn)
        s.lsn.append(self.lsn - 5)
        s.xid.append(self.lsn)
        s.commit_ts_us.append(1_700_000_000_000_000 + self.lsn)
        s.total_order.append(1)
        s.collection_order.append(1)
        s.before.append(None if before is None else self._encode(before))
        s.before_key_only.append(key_only)
        s.after.append(None if after is None else self._encode(after))
        s.truncate_options.append(0)
        return self
