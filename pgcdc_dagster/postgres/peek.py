"""Read one bounded window of a pgoutput slot without consuming it.

``COPY (SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes(...)) TO STDOUT
(FORMAT binary)`` streams the window; psycopg2's ``copy_expert`` hands every CopyData
message (one row) to the assembler's :class:`~pgcdc_dagster.cdc.pgoutput.copyrows.CopySink`,
which parses the COPY framing and the pgoutput message in place, so the raw bytes of a
window are never held in memory and decoding overlaps the server's work.

The slot is only peeked: advancing it (``pg_replication_slot_advance``) after the sink has
committed is the job of :mod:`pgcdc_dagster.postgres.slot`. The window is always bounded by
an explicit ``upto_lsn`` (an unbounded peek pins WAL and re-decodes from ``restart_lsn``).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

from psycopg2 import sql

from pgcdc_dagster.cdc.changes import Window
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.cdc.pgoutput.assembler import DEFAULT_SPILL_BYTES, Assembler
from pgcdc_dagster.cdc.pgoutput.options import PgOutputOptions, StreamingMode, choose_options
from pgcdc_dagster.cdc.pgoutput.pending import PendingTxn
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.postgres.snapshot_read import set_session

_PEEK = sql.SQL(
    "COPY (SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes("
    "{slot}, {upto}::pg_lsn, {nchanges}, {options})) TO STDOUT (FORMAT binary)")


def build_peek_query(
    slot: str, upto_lsn: Lsn, options: PgOutputOptions, upto_nchanges: int | None = None,
) -> sql.Composed:
    """The COPY statement for one window (values as literals: COPY takes no parameters).

    Raises:
        ConfigurationError: ``upto_lsn`` is missing.
    """
    if upto_lsn is None:
        raise ConfigurationError("peek_window needs an explicit upto_lsn: an unbounded peek "
                                 "pins WAL and re-decodes the whole backlog")
    values = [v for pair in options.as_pairs() for v in pair]
    return _PEEK.format(
        slot=sql.Literal(slot),
        upto=sql.Literal(str(Lsn(upto_lsn))),
        nchanges=sql.Literal(upto_nchanges),
        options=sql.SQL(", ").join(sql.Literal(v) for v in values),
    )


def peek_window(
    conn: Any,
    slot: str,
    publication: str | Sequence[str],
    upto_lsn: Lsn,
    *,
    proto_version: int | None = None,
    messages: bool = True,
    streaming: bool | StreamingMode = False,
    two_phase: bool = False,
    binary: bool = False,
    skip_below: Lsn | None = None,
    upto_nchanges: int | None = None,
    decoding_work_mem: str | None = None,
    spill_limit_bytes: int = DEFAULT_SPILL_BYTES,
    spill_dir: str | None = None,
    prepared: dict[str, PendingTxn] | None = None,
    portion_changes: int | None = None,
    on_portion: Callable[[Window], None] | None = None,
) -> Window:
    """Decode the slot's committed changes up to ``upto_lsn`` into a Window, without consuming.

    Args:
        conn: a psycopg2 connection (autocommit or not; nothing is committed here). Its
            session's text output settings are pinned to the snapshot's
            (:data:`~pgcdc_dagster.postgres.snapshot_read.SESSION_SETTINGS`: ISO dates,
            ``postgres`` intervals, UTC, shortest exact floats, hex bytea), so values decode
            the same whatever the connection had; they stay set afterwards.
        slot: logical slot name (pgoutput plugin).
        publication: publication name(s) to decode.
        upto_lsn: window bound; required, never NULL.
        proto_version: pgoutput protocol version; default: the highest one this server
            offers (see :mod:`pgcdc_dagster.cdc.pgoutput.options`).
        messages: decode logical decoding messages.
        streaming: ``True``/``"on"`` to receive large in-progress transactions as streams
            (protocol 2+), ``"parallel"`` for protocol 4's variant.
        two_phase: decode prepared transactions at PREPARE (protocol 3+); marks the slot
            two-phase for good. Keep ``prepared`` across windows when using it.
        binary: values in binary send format instead of text.
        skip_below: drop transactions whose commit LSN is below this (already delivered).
        upto_nchanges: stop after this many rows (checked by PostgreSQL only between
            transactions, so whole transactions always come back).
        decoding_work_mem: ``logical_decoding_work_mem`` for this peek (e.g. ``'64kB'``);
            PostgreSQL streams (or spills) a transaction beyond it.
        spill_limit_bytes: client memory budget for buffered streamed/prepared
            transactions before they go to a temporary file.
        spill_dir: directory for those temporary files.
        prepared: prepared transactions carried over from the previous window; updated.
        portion_changes: bounded memory for huge transactions: as soon as this many rows
            have been written into the window (while the COPY still streams, inside a
            transaction if need be), they go to ``on_portion`` and are dropped here. Every
            portion holds exactly ``portion_changes`` rows; ``total_order`` and
            ``collection_order`` continue across portions as without them.
        on_portion: receives each portion: a Window with ``tables`` only (no messages,
            transactions or counts, which stay in the returned Window). Only rows of
            transactions committed in this window are ever written, hence handed out (an
            ordinary transaction is sent by pgoutput only once committed; streamed and
            prepared ones are buffered and written only at their Stream Commit / Commit
            Prepared). Portions are provisional until ``peek_window`` returns: if it
            raises, the caller must discard the portions it received (not commit them).
            It runs with the cyclic GC enabled as the caller had it.

    Returns:
        The committed changes of the window, with ``slot_rows`` set: with portions, the
        segments not yet handed out plus the whole window's metadata (``transactions``,
        ``messages``, ``change_count``, ``last_commit_end_lsn``).

    Raises:
        ConfigurationError: missing ``upto_lsn`` or options the server cannot serve.
        DecodeError: the stream could not be decoded.
        ValueError: ``portion_changes`` without ``on_portion`` or the reverse, or < 1.
    """
    names = (publication,) if isinstance(publication, str) else tuple(publication)
    mode: StreamingMode = "on" if streaming is True else "off" if streaming is False else \
        streaming
    if proto_version is None:
        options = choose_options(conn.server_version, names, messages=messages,
                                 streaming=mode, two_phase=two_phase, binary=binary)
    else:
        options = PgOutputOptions(names, proto_version, messages, mode, two_phase, binary)
    query = build_peek_query(slot, upto_lsn, options, upto_nchanges)
    gc_was_enabled = gc.isenabled()
    portion_hook = on_portion
    if on_portion is not None and gc_was_enabled:
        def portion_hook(portion: Window) -> None:
            gc.enable()  # the consumer's own garbage must not pile up
            try:
                on_portion(portion)
            finally:
                gc.disable()

    assembler = Assembler(skip_below=skip_below, spill_limit_bytes=spill_limit_bytes,
                          spill_dir=spill_dir, prepared=prepared,
                          portion_changes=portion_changes, on_portion=portion_hook)
    sink = assembler.copy_sink()
    # A window allocates millions of small tuples; cyclic GC passes over them cost ~25 %.
    gc.disable()
    try:
        with conn.cursor() as cur:
            # The text output of dates, intervals, floats... must match the snapshot's.
            set_session(cur, local=False)
            if decoding_work_mem is None:
                cur.copy_expert(query, sink)
            else:
                cur.execute("SET logical_decoding_work_mem = %s", (decoding_work_mem,))
                cur.copy_expert(query, sink)
                # Not in a finally: after a failure the transaction may be aborted, and the
                # RESET error would hide the real one (the SET dies with that transaction).
                cur.execute("RESET logical_decoding_work_mem")
    finally:
        if gc_was_enabled:
            gc.enable()
    sink.close()
    window = assembler.finish()
    window.slot_rows = sink.row_count
    return window
