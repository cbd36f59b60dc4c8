"""Capture settings as a Dagster resource, named after Debezium's connector properties."""

from __future__ import annotations

import dagster as dg
from pydantic import Field, PrivateAttr

from pgcdc_dagster.capture.settings import (
    DEFAULT_INCREMENTAL_CHUNK_SIZE,
    DEFAULT_STATEMENT_TIMEOUT_MS,
    CaptureSettings,
)
from pgcdc_dagster.cdc.column_options import ColumnOptions, split_regex_list
from pgcdc_dagster.cdc.plugins import check_plugin
from pgcdc_dagster.cdc.typeconv import TypeModes
from pgcdc_dagster.postgres.slot_lock import SlotLease, acquire


def split_list(value: str) -> tuple[str, ...]:
    """Split a comma-separated Debezium list of regular expressions (``table.include.list``,
    ``PGCDC_TABLES``, ...) as Debezium does: ``\\,`` is a comma of the expression, and so is
    a comma inside ``{m,n}``, ``(...)`` or ``[...]`` (``public\\.t{1,3}``)."""
    return tuple(split_regex_list(value))


class CaptureResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """What to capture and how (one replication slot)."""

    tables: str = Field(
        default="",
        description="table.include.list (PGCDC_TABLES): comma-separated schema.table regular "
        "expressions; empty captures every table with a primary key.",
    )
    exclude_tables: str = Field(default="", description="table.exclude.list.")
    slot: str = Field(default="pgcdc", description="slot.name (PGCDC_SLOT).")
    publication: str = Field(default="pgcdc",
                             description="publication.name (PGCDC_PUBLICATION).")
    slot_failover: bool = Field(
        default=True,
        description="slot.failover: create the slot as a failover slot on PostgreSQL 17+ "
        "(synchronized to standbys with sync_replication_slots, so it survives a promotion); "
        "older servers get an ordinary slot.")
    plugin_name: str = Field(
        default="pgoutput",
        description="plugin.name (PGCDC_PLUGIN_NAME): the logical decoding plugin of the slot, "
        "pgoutput | decoderbufs | wal2json. decoderbufs and wal2json must be installed on "
        "the server; see docs/plugins.md for what each cannot carry.")
    publication_autocreate_mode: str = Field(
        default="filtered",
        description="publication.autocreate.mode: filtered | all_tables | disabled.")
    topic_prefix: str = Field(default="pgcdc",
                              description="topic.prefix: the logical server name in source.name.")
    snapshot_mode: str = Field(default="initial", description="snapshot.mode.")
    time_precision_mode: str = Field(default="adaptive", description="time.precision.mode.")
    decimal_handling_mode: str = Field(default="precise", description="decimal.handling.mode.")
    interval_handling_mode: str = Field(default="numeric",
                                        description="interval.handling.mode.")
    binary_handling_mode: str = Field(default="bytes", description="binary.handling.mode.")
    hstore_handling_mode: str = Field(default="json", description="hstore.handling.mode.")
    include_unknown_datatypes: bool = Field(default=False,
                                            description="include.unknown.datatypes.")
    unavailable_value_placeholder: str = Field(
        default="__debezium_unavailable_value", description="unavailable.value.placeholder.")
    money_fraction_digits: int = Field(
        default=2, description="money.fraction.digits: the scale of MONEY values.")
    window_max_bytes: int = Field(
        default=256 << 20, description="Largest WAL span (bytes) one micro-batch window reads.")
    window_max_changes: int = Field(
        default=2_000_000, description="upto_nchanges of a window: slot rows one micro-batch "
        "window reads at most (PostgreSQL ends it with the transaction reaching it; 0: no cap).")
    window_portion_changes: int = Field(
        default=10_000, description="Changes of a window handed to the bronze writer at a "
        "time while the window is still read (bounds memory for huge transactions; 0: whole "
        "windows).")
    max_windows: int = Field(default=1000,
                             description="Windows one micro-batch run may read at most.")
    time_budget_seconds: float = Field(
        default=600.0, description="A micro-batch run stops at a window boundary after this.")
    snapshot_chunk_bytes: int = Field(
        default=64 << 20, description="Heap bytes per parallel snapshot chunk.")
    snapshot_include_collection_list: str = Field(
        default="",
        description="snapshot.include.collection.list: comma-separated schema.table regular "
        "expressions of the captured tables to snapshot; the others stream from the "
        "snapshot's point without their existing rows. Empty snapshots every captured table.")
    snapshot_select_statement_overrides: dict[str, str] = Field(
        default_factory=dict,
        description="snapshot.select.statement.overrides: schema.table -> the SELECT that "
        "reads that table's snapshot (Debezium's snapshot.select.statement.overrides."
        "<schema>.<table>); one read-only SELECT returning every captured column.")
    snapshot_fetch_size: int = Field(
        default=10240, description="snapshot.fetch.size: rows per read (sizes the COPY "
        "parser's block, which bounds each chunk reader's memory).")
    snapshot_binary_copy: bool = Field(
        default=True, description="Read the snapshot columns the Arrow reader takes natively "
        "(numbers, booleans, TIMESTAMPTZ, DATE, text types) as Arrow values; the others come "
        "as their text output. False reads every column as its text output.")
    snapshot_max_threads: int = Field(
        default=0, description="snapshot.max.threads: chunks read at once; 0 = Spark's "
        "default parallelism.")
    snapshot_spark_threshold_rows: int = Field(
        default=1_000_000, description="Rows (the catalog's estimate) of the tables a "
        "snapshot step reads above which Spark reads the chunks; a smaller snapshot reads "
        "them in the run's process without starting Spark. 0: always Spark.")
    column_include_list: str = Field(
        default="",
        description="column.include.list: comma-separated regular expressions of "
        "schema.table.column names to capture; key columns are always kept. Not with "
        "column.exclude.list.")
    column_exclude_list: str = Field(
        default="",
        description="column.exclude.list: comma-separated regular expressions of "
        "schema.table.column names left out of events and silver (key columns are kept).")
    column_propagate_source_type: str = Field(
        default="",
        description="column.propagate.source.type: regular expressions of columns whose "
        "schema gets __debezium.source.column.type/length/scale parameters.")
    message_key_columns: str = Field(
        default="",
        description="message.key.columns: '<schema>.<table>:<column>,<column>;...' - the "
        "event key and silver key of the matched tables instead of the primary key.")
    column_mappers: dict[str, str] = Field(
        default_factory=dict,
        description="Column value mappers by their Debezium property name, each mapped to "
        "comma-separated schema.table.column regular expressions: "
        "column.mask.with.<N>.chars, column.truncate.to.<N>.chars, "
        "column.mask.hash.<algorithm>.with.salt.<salt>, "
        "column.mask.hash.v2.<algorithm>.with.salt.<salt>.")

    skipped_operations: str = Field(
        default="none",
        description="skipped.operations: comma-separated c, u, d, t to leave out of bronze, or "
        "'none'. (Debezium defaults to 't'; here truncates are captured so silver honours "
        "them.)")
    tombstones_on_delete: bool = Field(
        default=False,
        description="tombstones.on.delete: add a tombstone row (op null) after each delete.")
    provide_transaction_metadata: bool = Field(
        default=False,
        description="provide.transaction.metadata: BEGIN/END records in "
        "<lakehouse>/bronze/_pgcdc/transactions.")
    heartbeat_interval_ms: int = Field(
        default=0,
        description="heartbeat.interval.ms: > 0 emits a heartbeat message at each run.")
    heartbeat_action_query: str = Field(
        default="", description="heartbeat.action.query: SQL run on the source at each run.")

    tombstone_retention_hours: int = Field(
        default=168,
        description="Silver keeps a deleted key's tombstone (__deleted = true) this many hours "
        "after the delete committed (PGCDC_TOMBSTONE_RETENTION_HOURS); the silver_maintenance "
        "job purges older ones. Replays happen only around a crash, so days are plenty.")

    vacuum_retention_hours: int = Field(
        default=168,
        description="The silver_maintenance job's vacuum deletes data files that commits "
        "removed more than this many hours ago (PGCDC_VACUUM_RETENTION_HOURS; default one "
        "week). Time travel (DeltaTable(uri, version=v), VERSION AS OF) works back to versions "
        "whose files were all removed within it.")
    target_file_bytes: int = Field(
        default=1 << 20,
        description="Target size in bytes of the silver and bronze data files that merges and "
        "compaction write (PGCDC_TARGET_FILE_BYTES; default 1 MiB). A change to k random "
        "keys rewrites about k files: smaller files rewrite less, larger ones open faster.")

    incremental_snapshot_chunk_size: int = Field(
        default=DEFAULT_INCREMENTAL_CHUNK_SIZE,
        description="incremental.snapshot.chunk.size (PGCDC_INCREMENTAL_CHUNK_SIZE): rows per "
        "incremental-snapshot chunk, each read between two watermarks. The default was "
        "chosen by measurement (docs/incremental.md), not copied from Debezium's 1024.")
    signal_data_collection: str = Field(
        default="",
        description="signal.data.collection (PGCDC_SIGNAL_DATA_COLLECTION): the Debezium-style "
        "signalling table <schema>.<table> (columns id, type, data) that signal_table_sensor "
        "polls; empty: no signalling table.")

    incremental_statement_timeout_ms: int = Field(
        default=DEFAULT_STATEMENT_TIMEOUT_MS,
        description="statement_timeout (PGCDC_INCREMENTAL_STATEMENT_TIMEOUT_MS) of every "
        "statement that runs user SQL: the check and the chunk queries of an "
        "additional-conditions filter, the check and the snapshot chunk reads of a "
        "snapshot.select.statement.overrides SELECT. 0: no timeout.")

    _slot_lease: SlotLease | None = PrivateAttr(default=None)

    def hold_slot(self, dsn: str, run_id: str) -> SlotLease:
        """Take the slot's lock (one reader per slot) and keep it until the run ends.

        Raises:
            SlotInUseError: another reader holds it (the message names it).
        """
        if self._slot_lease is None or not self._slot_lease.held:
            self._slot_lease = acquire(dsn, self.slot, run_id)
        return self._slot_lease

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """The run ends: free the slot's lock if this run took it."""
        lease, self._slot_lease = self._slot_lease, None
        if lease is not None:
            lease.release()

    def settings(self, dsn: str, lakehouse: str) -> CaptureSettings:
        """The engine's settings for this capture."""
        modes = TypeModes(
            time_precision=self.time_precision_mode,
            decimal=self.decimal_handling_mode,
            interval=self.interval_handling_mode,
            binary=self.binary_handling_mode,
            hstore=self.hstore_handling_mode,
            include_unknown=self.include_unknown_datatypes,
            unavailable_placeholder=self.unavailable_value_placeholder,
            money_fraction_digits=self.money_fraction_digits,
        )
        return CaptureSettings(
            dsn=dsn, lakehouse=lakehouse,
            include=split_list(self.tables), exclude=split_list(self.exclude_tables),
            slot=self.slot, publication=self.publication, slot_failover=self.slot_failover,
            plugin_name=check_plugin(self.plugin_name),
            publication_autocreate=self.publication_autocreate_mode,
            topic_prefix=self.topic_prefix, modes=modes, snapshot_mode=self.snapshot_mode,
            window_max_bytes=self.window_max_bytes, max_windows=self.max_windows,
            window_max_changes=self.window_max_changes,
            window_portion_changes=self.window_portion_changes,
            time_budget_s=self.time_budget_seconds,
            snapshot_chunk_bytes=self.snapshot_chunk_bytes,
            snapshot_include=split_list(self.snapshot_include_collection_list),
            snapshot_select_overrides=tuple(self.snapshot_select_statement_overrides.items()),
            snapshot_fetch_size=self.snapshot_fetch_size,
            snapshot_max_threads=self.snapshot_max_threads,
            snapshot_spark_threshold_rows=self.snapshot_spark_threshold_rows,
            snapshot_binary=self.snapshot_binary_copy,
            column_options=self.column_options(),
            skipped_operations=self.skipped_operations,
            tombstones_on_delete=self.tombstones_on_delete,
            provide_transaction_metadata=self.provide_transaction_metadata,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            heartbeat_action_query=self.heartbeat_action_query,
            incremental_chunk_size=self.incremental_snapshot_chunk_size,
            signal_data_collection=self.signal_data_collection,
            incremental_statement_timeout_ms=self.incremental_statement_timeout_ms,
            target_file_bytes=self.target_file_bytes,
        )

    def column_options(self) -> tuple[tuple[str, str], ...]:
        """The column options as ``(property, value)`` pairs, checked (ConfigurationError)."""
        pairs = (
            ("column.include.list", self.column_include_list),
            ("column.exclude.list", self.column_exclude_list),
            ("column.propagate.source.type", self.column_propagate_source_type),
            ("message.key.columns", self.message_key_columns),
            *self.column_mappers.items(),
        )
        options = tuple((p, v) for p, v in pairs if v.strip())
        ColumnOptions.parse(options)
        return options
