"""pgoutput protocol-1 messages built from another plugin's rows.

A translator (wal2json, decoderbufs) describes each change by table and column name; this
module turns it into the bytes pgoutput would have sent: a Relation message before the
first change of each table in a window, then Insert / Update / Delete with text-format tuples
(``'t'`` value, ``'n'`` NULL, ``'u'`` unchanged TOAST), Truncate, logical decoding Messages,
and Begin / Commit around each transaction (protocol 1 layouts: PostgreSQL manual,
"Logical Replication Message Formats").

Old-tuple rules follow pgoutput: under REPLICA IDENTITY FULL an update and a delete carry
``'O'`` with every column; otherwise a delete carries ``'K'`` with the identity columns (the
others NULL) and an update carries ``'K'`` only when an identity column changed.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from pgcdc_dagster.cdc.changes import UNCHANGED_TOAST, Column, Relation, Row
from pgcdc_dagster.cdc.changes import Value as RowValue
from pgcdc_dagster.cdc.pgoutput.messages import PG_EPOCH_UNIX_US
from pgcdc_dagster.exceptions import DecodeError


class _Missing:
    """A column the plugin left out of a new tuple: unchanged TOAST for varlena columns."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()
Value = str | bytes | None | _Missing
"""A column value from a plugin: its text output, None for NULL, or :data:`MISSING`."""

_BYTEA = 17
_BEGIN = struct.Struct(">cQqI")
_COMMIT = struct.Struct(">cBQQq")
_OID = struct.Struct(">cI")
_MESSAGE = struct.Struct(">cBQ")


@dataclass(frozen=True)
class TableInfo:
    """A captured table as the catalog describes it when the window is read."""

    relation: Relation
    """Columns (generated ones excluded, as pgoutput), types, typmods and the key flags
    pgoutput sets (every column under FULL, the identity index's columns otherwise)."""
    varlena: frozenset[str] = frozenset()
    """Columns of variable-length types: only those can be unchanged TOAST."""
    spec: list[tuple[str, bool, bool]] = field(default_factory=list, compare=False, repr=False)
    """(name, key flag, varlena) per column, for the tuple encoder."""
    bytea: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    """The ``bytea`` columns (wal2json writes them as bare hex)."""

    def __post_init__(self) -> None:
        # Under YugabyteDB's REPLICA IDENTITY CHANGE (``c``) any column may be left out of an
        # update (yboutput sends it as 'u'), not only variable-length ones.
        partial = self.relation.replica_identity == "c"
        self.spec.extend((c.name, c.is_key, partial or c.name in self.varlena)
                         for c in self.relation.columns)
        object.__setattr__(self, "bytea", frozenset(
            c.name for c in self.relation.columns if c.type_oid == _BYTEA))


def _string(text: str) -> bytes:
    return text.encode() + b"\x00"


def _unix_to_pg(unix_us: int) -> int:
    return unix_us - PG_EPOCH_UNIX_US


def begin(final_lsn: int, commit_time_unix_us: int, xid: int) -> bytes:
    """Begin: final (commit) LSN, commit time, xid."""
    return _BEGIN.pack(b"B", final_lsn, _unix_to_pg(commit_time_unix_us), xid & 0xFFFFFFFF)


def commit(commit_lsn: int, end_lsn: int, commit_time_unix_us: int) -> bytes:
    """Commit: flags 0, commit LSN, end LSN, commit time."""
    return _COMMIT.pack(b"C", 0, commit_lsn, end_lsn, _unix_to_pg(commit_time_unix_us))


def message(transactional: bool, lsn: int, prefix: str, content: bytes) -> bytes:
    """A logical decoding message (``pg_logical_emit_message``)."""
    return (_MESSAGE.pack(b"M", 1 if transactional else 0, lsn) + _string(prefix)
            + struct.pack(">I", len(content)) + content)


def relation_message(rel: Relation) -> bytes:
    """Relation: oid, namespace, name, replica identity, columns (flags, name, type, typmod)."""
    parts = [_OID.pack(b"R", rel.oid), _string(rel.namespace), _string(rel.name),
             rel.replica_identity.encode()[:1], struct.pack(">H", len(rel.columns))]
    for col in rel.columns:
        parts.append(bytes([1 if col.is_key else 0]) + _string(col.name)
                     + struct.pack(">Ii", col.type_oid, col.typmod))
    return b"".join(parts)


def truncate(oids: list[int]) -> bytes:
    """Truncate of the given relations (no CASCADE / RESTART IDENTITY flags)."""
    return struct.pack(">cIB", b"T", len(oids), 0) + b"".join(struct.pack(">I", o) for o in oids)


def row_of(info: TableInfo, values: Mapping[str, Value], *, toast: bool,
           only_keys: bool = False) -> Row:
    """The tuple pgoutput would send, as its decoder reads it: text values as bytes, None for
    NULL (and for non-key columns of a key-only tuple), :data:`UNCHANGED_TOAST` for a column
    left out of a new tuple (``toast``) that may be unchanged TOAST, None otherwise."""
    out: list[RowValue] = []
    get = values.get
    for name, is_key, varlena in info.spec:
        value = get(name, MISSING) if is_key or not only_keys else None
        if value is None:
            out.append(None)
        elif value is MISSING:
            out.append(UNCHANGED_TOAST if toast and varlena else None)
        else:
            data = value.encode() if isinstance(value, str) else value
            assert isinstance(data, bytes)
            out.append(data)
    return tuple(out)


def old_image(info: TableInfo, new: Mapping[str, Value] | None,
              old: Mapping[str, Value] | None) -> tuple[Row | None, bool]:
    """(old tuple, key only) that pgoutput sends with an update (``new`` given) or a delete
    (``new`` None): under REPLICA IDENTITY FULL the whole old row; otherwise the identity
    columns, for an update only when one of them changed; (None, False) for none."""
    rel = info.relation
    if rel.replica_identity == "f":
        return (row_of(info, old or {}, toast=False), False) if old or new is None \
            else (None, False)
    if new is not None and not (old and any(
            c.is_key and c.name in old and old[c.name] != new.get(c.name)
            for c in rel.columns)):
        return None, False
    return row_of(info, old or {}, toast=False, only_keys=True), True


def _tuple(row: Row) -> bytes:
    out = bytearray(len(row).to_bytes(2, "big"))
    for value in row:
        if value is None:
            out += b"n"
        elif value is UNCHANGED_TOAST:
            out += b"u"
        else:
            assert isinstance(value, bytes)
            out += b"t"
            out += len(value).to_bytes(4, "big")
            out += value
    return bytes(out)


@dataclass
class WindowMessages:
    """Builds one window's pgoutput messages; remembers which Relations it has sent."""

    tables: Mapping[tuple[str, str], TableInfo]
    sent: set[int] = field(default_factory=set)

    def info(self, schema: str, table: str) -> TableInfo | None:
        """The table's description; None for a table that is not captured."""
        return self.tables.get((schema, table))

    def _relation(self, info: TableInfo) -> list[bytes]:
        if info.relation.oid in self.sent:
            return []
        self.sent.add(info.relation.oid)
        return [relation_message(info.relation)]

    def insert(self, info: TableInfo, new: Mapping[str, Value]) -> list[bytes]:
        """Relation (first time) + Insert."""
        body = _tuple(row_of(info, new, toast=False))
        return [*self._relation(info), _OID.pack(b"I", info.relation.oid) + b"N" + body]

    def update(self, info: TableInfo, new: Mapping[str, Value],
               old: Mapping[str, Value] | None) -> list[bytes]:
        """Relation (first time) + Update, with the old tuple pgoutput would send."""
        head = _OID.pack(b"U", info.relation.oid)
        before, key_only = old_image(info, new, old)
        if before is not None:
            head += (b"K" if key_only else b"O") + _tuple(before)
        return [*self._relation(info), head + b"N" + _tuple(row_of(info, new, toast=True))]

    def delete(self, info: TableInfo, old: Mapping[str, Value]) -> list[bytes]:
        """Relation (first time) + Delete with the old key (or the whole old row, FULL)."""
        before, key_only = old_image(info, None, old)
        assert before is not None
        kind = b"K" if key_only else b"O"
        return [*self._relation(info),
                _OID.pack(b"D", info.relation.oid) + kind + _tuple(before)]

    def truncate(self, infos: list[TableInfo]) -> list[bytes]:
        """Relations (first time) + one Truncate of ``infos``."""
        out: list[bytes] = []
        for info in infos:
            out.extend(self._relation(info))
        return [*out, truncate([i.relation.oid for i in infos])]


def lsn_of(text: str) -> int:
    """``'0/15057C8'`` -> 22042568.

    Raises:
        DecodeError: not an LSN.
    """
    try:
        hi, lo = text.split("/")
        return (int(hi, 16) << 32) | int(lo, 16)
    except ValueError:
        raise DecodeError(f"not an LSN: {text!r:.40}") from None


def relation_of(oid: int, schema: str, table: str, identity: str,
                columns: list[tuple[str, int, int, bool]]) -> Relation:
    """A :class:`Relation` from catalog rows (name, type oid, typmod, key flag)."""
    return Relation(oid, schema, table, identity,
                    tuple(Column(n, t, m, k) for n, t, m, k in columns))
