"""Debezium message events (``op = m``) and transaction metadata records, as Arrow rows.

Message events (EVT-15, EVT-25, STR-61): ``source`` with empty schema and table, ``op = m``,
``message`` = {prefix, content}; non-transactional messages carry no ``txId``.
Transaction records (EVT-14, STR-69): one BEGIN and one END per transaction, with ``id`` as
the events' ``transaction.id``, and on END the event count and per-table counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from pgcdc_dagster.cdc.changes import LogicalMessage, TransactionInfo
from pgcdc_dagster.cdc.envelope import (
    CONNECTOR_VERSION,
    SOURCE_TYPE,
    SourceIdentity,
    sequence_text,
)
from pgcdc_dagster.names import table_id

MESSAGE_TYPE = pa.struct([pa.field("prefix", pa.string()), pa.field("content", pa.binary())])

MESSAGES_SCHEMA = pa.schema([
    pa.field("source", SOURCE_TYPE, nullable=False),
    pa.field("op", pa.string(), nullable=False),
    pa.field("ts_ms", pa.int64()),
    pa.field("message", MESSAGE_TYPE),
    pa.field("transactional", pa.bool_()),
    pa.field("__commit_lsn", pa.int64(), nullable=False),
    pa.field("__ordinal", pa.int64(), nullable=False),
])

DATA_COLLECTION = pa.struct([pa.field("data_collection", pa.string()),
                             pa.field("event_count", pa.int64())])

TRANSACTIONS_SCHEMA = pa.schema([
    pa.field("status", pa.string(), nullable=False),
    pa.field("id", pa.string(), nullable=False),
    pa.field("event_count", pa.int64()),
    pa.field("data_collections", pa.list_(DATA_COLLECTION)),
    pa.field("ts_ms", pa.int64()),
    pa.field("__commit_lsn", pa.int64(), nullable=False),
    pa.field("__ordinal", pa.int64(), nullable=False),
])


def transaction_id(xid: int, commit_lsn: int) -> str:
    """``transaction.id`` of an event: ``<txId>:<commit LSN>``."""
    return f"{xid}:{commit_lsn}"


def message_rows(messages: Sequence[LogicalMessage], ident: SourceIdentity,
                 processed_ms: int) -> pa.Table:
    """One ``op = m`` row per logical decoding message."""
    n = len(messages)
    ts = [(m.commit_ts_us // 1000) if m.commit_ts_us is not None else processed_ms
          for m in messages]
    source = pa.StructArray.from_arrays([
        pa.array([CONNECTOR_VERSION] * n), pa.array(["postgresql"] * n),
        pa.array([ident.name] * n), pa.array(ts, pa.int64()), pa.array(["false"] * n),
        pa.array([ident.db] * n),
        pa.array([sequence_text(m.commit_lsn, m.lsn) for m in messages]),
        pa.array([t * 1000 for t in ts], pa.int64()),
        pa.array([""] * n), pa.array([""] * n),
        pa.array([m.xid for m in messages], pa.int64()),
        pa.array([m.lsn for m in messages], pa.int64()), pa.nulls(n, pa.int64()),
    ], fields=list(SOURCE_TYPE))
    message = pa.StructArray.from_arrays(
        [pa.array([m.prefix for m in messages]),
         pa.array([m.content for m in messages], pa.binary())],
        fields=list(MESSAGE_TYPE))
    return pa.Table.from_arrays([
        source, pa.array(["m"] * n), pa.array([processed_ms] * n, pa.int64()), message,
        pa.array([m.transactional for m in messages]),
        pa.array([m.commit_lsn for m in messages], pa.int64()),
        pa.array([m.total_order for m in messages], pa.int64()),
    ], schema=MESSAGES_SCHEMA)


def transaction_rows(transactions: Sequence[TransactionInfo], ident: SourceIdentity,
                     processed_ms: int) -> pa.Table:
    """A BEGIN and an END row per transaction (``ident`` is kept for symmetry)."""
    del ident
    rows: list[dict[str, object]] = []
    for t in transactions:
        tid = transaction_id(t.xid, t.commit_lsn)
        ts = t.commit_ts_us // 1000
        rows.append({"status": "BEGIN", "id": tid, "event_count": None,
                     "data_collections": None, "ts_ms": ts,
                     "__commit_lsn": t.commit_lsn, "__ordinal": 0})
        rows.append({"status": "END", "id": tid, "event_count": t.event_count,
                     "data_collections": [{"data_collection": table_id(s, n), "event_count": c}
                                          for s, n, c in t.per_table],
                     "ts_ms": ts, "__commit_lsn": t.commit_lsn, "__ordinal": 1})
    del processed_ms
    return pa.Table.from_pylist(rows, schema=TRANSACTIONS_SCHEMA)
