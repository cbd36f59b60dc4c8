"""Export bronze change events as Debezium JSON lines (what Kafka would have carried).

Usage::

    python -m pgcdc_dagster.export --lakehouse ./lakehouse --table public.orders --limit 10
    python -m pgcdc_dagster.export --lakehouse ./lakehouse --table _pgcdc.messages

Each output line is one record, ``{"topic": ..., "key": ..., "value": ...}``, key and value
as Kafka Connect's JsonConverter writes them with ``schemas.enable=true`` (``--value-only``
prints the value message alone, as ``kafka-console-consumer`` shows it). Events come in
sequence order (commit LSN, then change ordinal). Each event gets the schema of its time from
the LSN-keyed schema history (``lake/schema_history.py``; a column stored in a versioned field
after a type change is put back under its name), or, for lakehouses without one, from the
``debezium.schema`` metadata bronze keeps on its fields; no database connection is needed.
The topic prefix is each row's ``source.name`` unless ``--topic-prefix`` overrides it.
``_pgcdc.messages`` and ``_pgcdc.transactions`` export the logical decoding messages and the
transaction metadata records. See ``docs/debezium-json.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TextIO

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from pgcdc_dagster.cdc.debezium_json import (
    DEFAULT_FORMAT,
    FORMATS,
    DebeziumRecord,
    TableCodec,
    table_codec_from_bronze,
    table_codec_of_shape,
)
from pgcdc_dagster.cdc.debezium_records import BINARY_MODES, message_to_json, transaction_to_json
from pgcdc_dagster.cdc.jackson import dumps
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.delta import open_table
from pgcdc_dagster.lake.paths import internal_uri, table_uri
from pgcdc_dagster.lake.schema_history import history_uri, read_history, shape_at
from pgcdc_dagster.names import resolve_table_id, splits

META_SCHEMA = "_pgcdc"
META_TABLES = ("messages", "transactions")
"""``_pgcdc.<name>`` names these capture-wide tables (``bronze/_pgcdc``); a source table of a
schema ``_pgcdc`` (whose path is escaped, ``lake/paths.py``) is named with the schema quoted,
``"_pgcdc".messages`` (``export_table(..., source_table=True)``)."""


def _ordered(table: pa.Table, limit: int | None) -> pa.Table:
    """Rows in sequence order; a tombstone stays right after its delete.

    A key change is a delete and a create at one sequence position (the UPDATE's): within a
    position the delete comes first, then its tombstone, then the create, as Debezium emits
    them (STR-73).
    """
    keys = [name for name in ("__commit_lsn", "__ordinal") if name in table.column_names]
    if "op" in table.column_names and "before" in table.column_names:
        op = table["op"]
        rank = pc.if_else(pc.is_null(op), 1, pc.if_else(pc.equal(op, "d"), 0, 2))
        table = table.append_column("__tomb", rank.cast(pa.int8()))
        keys.append("__tomb")
    if keys:
        table = table.sort_by([(k, "ascending") for k in keys])
    if "__tomb" in table.column_names:
        table = table.drop_columns(["__tomb"])
    return table.slice(0, limit) if limit is not None else table


def _internal(schema: str, table: str, source_table: bool) -> bool:
    return not source_table and schema == META_SCHEMA and table in META_TABLES


def _bronze(lakehouse: str, schema: str, table: str, internal: bool) -> DeltaTable:
    found = open_table(internal_uri(lakehouse, table) if internal
                       else table_uri(lakehouse, "bronze", schema, table))
    if found is None:
        raise ConfigurationError(
            f"no bronze table for {schema}.{table} under {lakehouse}; check --lakehouse and "
            "--table (schema.table, or _pgcdc.messages / _pgcdc.transactions"
            + (f"; a source table of a schema _pgcdc is \"_pgcdc\".{table}" if internal
               else "") + ")")
    return found


def export_table(lakehouse: str, schema: str, table: str, *, limit: int | None = None,
                 topic_prefix: str | None = None, fmt: str = DEFAULT_FORMAT,
                 transaction_metadata: bool = False, binary_mode: str = "bytes",
                 schema_name_adjustment: str = "none",
                 source_table: bool = False,
                 replace_null_with_default: bool = True) -> Iterator[DebeziumRecord]:
    """The bronze events of one table as Debezium records, in sequence order.

    Args:
        lakehouse: The lakehouse root (as in ``CaptureSettings.lakehouse``).
        schema: Source schema, or ``_pgcdc`` for the message/transaction tables.
        table: Source table, or ``messages`` / ``transactions``.
        limit: Export the first ``limit`` events only.
        topic_prefix: ``topic.prefix``; default: each row's ``source.name``.
        fmt: Debezium release line to imitate (``3.6``, the default; ``3.1``; ``2.7``).
        transaction_metadata: ``provide.transaction.metadata`` (fills ``transaction``).
        binary_mode: ``binary.handling.mode`` of message contents.
        schema_name_adjustment: ``schema.name.adjustment.mode`` (``none`` or ``avro``).
        source_table: ``_pgcdc.messages`` / ``_pgcdc.transactions`` name a source table of a
            schema ``_pgcdc``, not the capture-wide tables.
        replace_null_with_default: the JsonConverter's ``replace.null.with.default`` (true,
            its default: a null column value whose schema has a default is written as it).
    """
    internal = _internal(schema, table, source_table)
    delta = _bronze(lakehouse, schema, table, internal)
    data = _ordered(delta.to_pyarrow_table(), limit)
    if internal and table == "messages":
        for row in data.to_pylist():
            prefix = topic_prefix or row["source"]["name"]
            yield message_to_json(row, prefix, fmt=fmt, binary_mode=binary_mode,
                                  replace_null_with_default=replace_null_with_default)
        return
    if internal and table == "transactions":
        if topic_prefix is None:
            raise ConfigurationError("transaction records carry no source block; give "
                                     "--topic-prefix")
        for row in data.to_pylist():
            yield transaction_to_json(row, topic_prefix)
        return
    arrow = delta.schema().to_arrow()
    bronze_schema = arrow if isinstance(arrow, pa.Schema) else pa.schema(arrow)
    history = read_history(history_uri(lakehouse), schema, table)
    codecs: dict[tuple[str, str | None], TableCodec] = {}
    for row in data.to_pylist():
        prefix = topic_prefix or row["source"]["name"]
        entry = shape_at(history, row["__commit_lsn"], row["__ordinal"]) if history else None
        shape_id = entry.shape.shape_id if entry is not None else None
        codec = codecs.get((prefix, shape_id))
        if codec is None:
            codec = codecs[(prefix, shape_id)] = (
                table_codec_of_shape(entry.shape.parsed(), prefix, schema, table, fmt=fmt,
                                     schema_name_adjustment=schema_name_adjustment)
                if entry is not None else
                table_codec_from_bronze(bronze_schema, prefix, schema, table, fmt=fmt,
                                        schema_name_adjustment=schema_name_adjustment))
        yield codec.record(row, transaction_metadata=transaction_metadata,
                           replace_null_with_default=replace_null_with_default)


def _split_table(lakehouse: str, name: str) -> tuple[str, str]:
    """``--table``: a table id (``public.orders``; a part holding a dot double-quoted,
    ``"a.b".c``); an unquoted name with several dots is the one such table in bronze."""
    stored = [t for t in splits(name.strip()) if open_table(
        table_uri(lakehouse, "bronze", *t)) is not None] if name.count(".") > 1 else []
    try:
        return resolve_table_id(name, stored)
    except ValueError as exc:
        raise ConfigurationError(f"--table: {exc}; e.g. public.orders") from None


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m pgcdc_dagster.export",
        description="Print bronze change events as Debezium JSON lines (JsonConverter, "
                    "schemas.enable=true).")
    parser.add_argument("--lakehouse", required=True, help="lakehouse root directory or URI")
    parser.add_argument("--table", required=True,
                        help="schema.table, or _pgcdc.messages / _pgcdc.transactions (a "
                        "source table of a schema _pgcdc: \"_pgcdc\".messages)")
    parser.add_argument("--limit", type=int, default=None, help="first N events only")
    parser.add_argument("--topic-prefix", default=None,
                        help="topic.prefix (default: each event's source.name)")
    parser.add_argument("--format", default=DEFAULT_FORMAT, choices=sorted(FORMATS),
                        help="Debezium release line whose output to reproduce")
    parser.add_argument("--transaction-metadata", action="store_true",
                        help="provide.transaction.metadata: fill the transaction block")
    parser.add_argument("--binary-handling-mode", default="bytes", choices=BINARY_MODES,
                        help="binary.handling.mode of logical message contents")
    parser.add_argument("--schema-name-adjustment", default="none", choices=("none", "avro"),
                        help="schema.name.adjustment.mode")
    parser.add_argument("--replace-null-with-default", default=True,
                        action=argparse.BooleanOptionalAction,
                        help="the JsonConverter's replace.null.with.default: a null value of "
                        "a column with a default is written as the default (default: on)")
    parser.add_argument("--value-only", action="store_true",
                        help="print the value message only (null for tombstones)")
    args = parser.parse_args(argv)
    stream = out if out is not None else sys.stdout
    try:
        schema, table = _split_table(args.lakehouse, args.table)
        # Only the plain spelling names a capture-wide table; "_pgcdc".messages is a source's.
        plain = args.table.strip() in {f"{META_SCHEMA}.{t}" for t in META_TABLES}
        for record in export_table(
                args.lakehouse, schema, table, limit=args.limit, topic_prefix=args.topic_prefix,
                fmt=args.format, transaction_metadata=args.transaction_metadata,
                binary_mode=args.binary_handling_mode,
                schema_name_adjustment=args.schema_name_adjustment, source_table=not plain,
                replace_null_with_default=args.replace_null_with_default):
            stream.write((dumps(record.value) if args.value_only else record.to_json_line())
                         + "\n")
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _exit(status: int) -> None:
    """End the process without the interpreter's finalization: Arrow's reader threads (the
    dataset scan under ``DeltaTable.to_pyarrow_table``) can still be torn down then and abort
    it (``terminate called without an active exception``, exit 134, after every line was
    printed: about 1 run in 15 here; apache/arrow#34314, delta-io/delta-rs#2184)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        status = 1
    sys.stderr.flush()
    os._exit(status)


def _run() -> int:
    """:func:`main`, quiet when the reader of the output goes away (``| head``): no
    traceback, status 1 (as Python's documentation for SIGPIPE suggests)."""
    try:
        return main()
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    _exit(_run())
