"""Read one bounded window of a decoderbufs or wal2json slot without consuming it.

Same contract as :func:`pgcdc_dagster.postgres.peek.peek_window` (explicit ``upto_lsn``,
nothing consumed, the session's text settings pinned): ``COPY (SELECT lsn, xid, data FROM
pg_logical_slot_peek_binary_changes(...)) TO STDOUT (FORMAT binary)`` (the binary variant
also serves text plugins), every row (:class:`~pgcdc_dagster.cdc.pgcopy.SlotRowSink`)
translated (``cdc/plugins``) and written into the pgoutput assembler, so the returned
:class:`Window` is built exactly as for pgoutput. The captured tables are described from the
catalog before the COPY (the connection cannot query while it streams): the publication's
tables, with pgoutput's key flags.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg2 import sql

from pgcdc_dagster.cdc.changes import Window
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.pgcopy import SlotRowSink
from pgcdc_dagster.cdc.pgoutput.assembler import Assembler
from pgcdc_dagster.cdc.plugins import DECODERBUFS, WAL2JSON, check_plugin
from pgcdc_dagster.cdc.plugins import wal2json as w2j
from pgcdc_dagster.cdc.plugins.decoderbufs import DecoderbufsTranslator
from pgcdc_dagster.cdc.plugins.pgwire import TableInfo, relation_of
from pgcdc_dagster.cdc.plugins.rows import RowOutput
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.postgres.snapshot_read import set_session

_PEEK = sql.SQL(
    "COPY (SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes("
    "{slot}, {upto}::pg_lsn, {nchanges}{options})) TO STDOUT (FORMAT binary)")

_TABLES_SQL = """
SELECT c.oid, n.nspname, c.relname, c.relreplident::text, a.attname, a.atttypid,
       a.atttypmod, (c.relreplident = 'f' OR a.attnum = ANY(i.indkey)) AS is_key,
       t.typlen = -1 AS varlena
FROM pg_catalog.pg_publication_tables p
JOIN pg_catalog.pg_namespace n ON n.nspname = p.schemaname
JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
     AND NOT a.attisdropped AND a.attgenerated = ''
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_catalog.pg_index i ON i.indrelid = c.oid
     AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))
WHERE p.pubname = %s
ORDER BY c.oid, a.attnum
"""


def captured_tables(conn: Any, publication: str) -> dict[tuple[str, str], TableInfo]:
    """The publication's tables as pgoutput would describe them now."""
    rows: dict[int, list[Any]] = {}
    with conn.cursor() as cur:
        cur.execute(_TABLES_SQL, (publication,))
        for row in cur.fetchall():
            rows.setdefault(int(row[0]), []).append(row)
    out: dict[tuple[str, str], TableInfo] = {}
    for oid, cols in rows.items():
        _, schema, table, ident = cols[0][:4]
        rel = relation_of(oid, str(schema), str(table), str(ident),
                          [(str(r[4]), int(r[5]), int(r[6]), bool(r[7])) for r in cols])
        out[(str(schema), str(table))] = TableInfo(
            rel, frozenset(str(r[4]) for r in cols if r[8]))
    return out


def build_plugin_peek_query(plugin: str, slot: str, upto_lsn: Lsn,
                            upto_nchanges: int | None = None) -> sql.Composed:
    """The COPY statement of one window of a decoderbufs or wal2json slot.

    Raises:
        ConfigurationError: another plugin.
    """
    if plugin not in (WAL2JSON, DECODERBUFS):
        raise ConfigurationError(f"peek_plugin_window reads decoderbufs or wal2json, not "
                                 f"{plugin!r} (pgoutput: peek.peek_window)")
    pairs = w2j.OPTIONS if plugin == WAL2JSON else ()
    options = sql.SQL("").join(sql.SQL(", {}, {}").format(sql.Literal(k), sql.Literal(v))
                               for k, v in pairs)
    return _PEEK.format(slot=sql.Literal(slot), upto=sql.Literal(str(Lsn(upto_lsn))),
                        nchanges=sql.Literal(upto_nchanges), options=options)


def peek_plugin_window(conn: Any, plugin: str, slot: str, publication: str, upto_lsn: Lsn, *,
                       upto_nchanges: int | None = None, portion_changes: int | None = None,
                       on_portion: Callable[[Window], None] | None = None) -> Window:
    """Decode the slot's committed changes up to ``upto_lsn`` (plugin ``decoderbufs`` or
    ``wal2json``) into a Window, without consuming; see ``peek.peek_window`` for the
    arguments.

    Raises:
        ConfigurationError: a missing ``upto_lsn`` or an unsupported plugin.
        DecodeError: a row the plugin's translator cannot read.
    """
    if upto_lsn is None:
        raise ConfigurationError("peek_plugin_window needs an explicit upto_lsn: an unbounded "
                                 "peek pins WAL and re-decodes the whole backlog")
    check_plugin(plugin)
    with conn.cursor() as cur:
        set_session(cur, local=False)
    assembler = Assembler(portion_changes=portion_changes, on_portion=on_portion)
    out = RowOutput(captured_tables(conn, publication), assembler)
    translate: Callable[[int, bytes], None]
    if plugin == WAL2JSON:
        translate = w2j.Wal2JsonTranslator(out).translate
    else:
        translate = DecoderbufsTranslator(out, int(upto_lsn)).translate
    query = build_plugin_peek_query(plugin, slot, upto_lsn, upto_nchanges)
    sink = SlotRowSink(translate)
    with conn.cursor() as cur:
        cur.copy_expert(query, sink)
    sink.close()
    window = assembler.finish()
    window.slot_rows = sink.rows
    return window
