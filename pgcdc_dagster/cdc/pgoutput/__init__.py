"""pgoutput: decode PostgreSQL's logical replication messages and assemble slot windows.

Pure code: bytes in, typed messages or a :class:`~pgcdc_dagster.cdc.changes.Window` out.
``decoder`` turns one message into a frozen dataclass (``messages``); ``assembler`` turns a
window of raw messages into committed, columnar :class:`~pgcdc_dagster.cdc.changes.TableChanges`
through the hot path in ``writer``; ``options`` picks the protocol version.
"""

from __future__ import annotations

from pgcdc_dagster.cdc.pgoutput.assembler import Assembler, assemble
from pgcdc_dagster.cdc.pgoutput.decoder import Decoder, decode, decode_all
from pgcdc_dagster.cdc.pgoutput.messages import MessageType, PgOutputMessage
from pgcdc_dagster.cdc.pgoutput.options import (
    PgOutputOptions,
    choose_options,
    required_proto_version,
)
from pgcdc_dagster.cdc.pgoutput.pending import PendingTxn

__all__ = [
    "Assembler",
    "Decoder",
    "MessageType",
    "PendingTxn",
    "PgOutputMessage",
    "PgOutputOptions",
    "assemble",
    "choose_options",
    "decode",
    "decode_all",
    "required_proto_version",
]
