"""Plain capture settings, built by the Dagster resources (or by tests and the demo)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pgcdc_dagster.cdc.typeconv import TypeModes
from pgcdc_dagster.exceptions import ConfigurationError

DEFAULT_INCREMENTAL_CHUNK_SIZE = 65536
"""``incremental.snapshot.chunk.size`` default, measured (docs/incremental.md)."""
SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
"""What PostgreSQL accepts as a replication slot name (``ReplicationSlotValidateName``)."""
SNAPSHOT_MODES = ("initial", "initial_only", "no_data", "never", "always", "when_needed")
"""``snapshot.mode`` values (``never`` is Debezium's old name of ``no_data``)."""
PUBLICATION_MODES = ("filtered", "all_tables", "disabled")
"""``publication.autocreate.mode`` values."""
MIN_TARGET_FILE_BYTES = 1024
"""Smallest ``target_file_bytes``: below it every row would get a file of its own."""
DEFAULT_STATEMENT_TIMEOUT_MS = 600_000
"""Default ``statement_timeout`` of statements that run user SQL (10 minutes: far above a
chunk's read, short enough that a runaway filter does not hold the slot for hours)."""


@dataclass(frozen=True, slots=True)
class CaptureSettings:
    """Everything the engine needs to know about one capture (one slot).

    Debezium property names are given where one exists.
    """

    dsn: str
    lakehouse: str
    include: tuple[str, ...] = ()
    """``table.include.list``: ``schema.table`` regular expressions; empty = every table."""
    exclude: tuple[str, ...] = ()
    """``table.exclude.list``."""
    slot: str = "pgcdc"
    """``slot.name``."""
    publication: str = "pgcdc"
    """``publication.name``."""
    slot_failover: bool = True
    """``slot.failover``: create the slot as a failover slot where the server has them
    (PostgreSQL 17+), so that standbys with ``sync_replication_slots`` keep a copy that
    survives a promotion. Debezium's default is false; here it is on where available."""
    plugin_name: str = "pgoutput"
    """``plugin.name``: pgoutput | decoderbufs | wal2json (``cdc/plugins``)."""
    publication_autocreate: str = "filtered"
    """``publication.autocreate.mode``: filtered | all_tables | disabled."""
    topic_prefix: str = "pgcdc"
    """``topic.prefix``: the logical server name in ``source.name``."""
    modes: TypeModes = field(default_factory=TypeModes)
    snapshot_mode: str = "initial"
    """``snapshot.mode``."""
    window_max_bytes: int = 256 << 20
    """Largest WAL span one window reads (transactions are never split, so a transaction
    larger than this arrives whole in the window where it commits)."""
    window_max_changes: int = 2_000_000
    """``upto_nchanges`` of a window (0: no cap). PostgreSQL checks it between records, so a
    window ends at its last whole transaction when the cap is reached."""
    window_portion_changes: int = 10_000
    """Changes of one window handed to the bronze writer at a time while the window is still
    being read, so that a huge transaction is converted and written in bounded portions
    (0: the whole window at once)."""
    silver_spark_threshold_rows: int = 2_000_000
    """Bronze rows of a silver batch above which Spark prepares it; smaller batches are
    prepared in Arrow on the driver, where Spark's fixed cost per job would dominate."""
    silver_batch_rows: int = 1_000_000
    """Bronze rows of one silver batch: a larger backlog catches up in several, each
    committed before the next is read (``capture/silver_apply.py``)."""
    snapshot_spark_threshold_rows: int = 1_000_000
    """Rows (the catalog's estimate) of the tables a snapshot step reads above which Spark
    reads the chunks; a smaller snapshot reads them on threads of the capture's process and
    never starts Spark (its fixed cost would dominate). 0: always Spark."""
    target_file_bytes: int = 1 << 20
    """Target size of the data files silver merges and upkeep's compaction write
    (``lake/data_files.py``)."""
    max_windows: int = 1000
    """Windows one micro-batch run may read before it returns."""
    time_budget_s: float = 600.0
    """Seconds a micro-batch run may spend before it stops at a window boundary."""
    snapshot_chunk_bytes: int = 64 << 20
    """Heap bytes per snapshot chunk (a key range, or a CTID range for a table without key)."""
    snapshot_include: tuple[str, ...] = ()
    """``snapshot.include.collection.list``: ``schema.table`` regular expressions of the
    captured tables to snapshot; the others stream from the snapshot's point without their
    existing rows. Empty = every captured table."""
    snapshot_select_overrides: tuple[tuple[str, str], ...] = ()
    """``snapshot.select.statement.overrides``: ``(schema.table, SELECT)`` pairs (Debezium's
    ``snapshot.select.statement.overrides.<schema>.<table>`` properties); the SELECT decides
    which rows the snapshot reads and must be one read-only SELECT returning the columns."""
    snapshot_fetch_size: int = 10240
    """``snapshot.fetch.size``: rows per read; sizes the reader's batches (this many rows
    of the table's average width), so it bounds each reader's memory."""
    snapshot_binary: bool = True
    """Read the columns the Arrow reader takes natively (numbers, booleans, TIMESTAMPTZ,
    DATE, text types) as Arrow values, the others as their text output; False: every
    column as its text output."""
    snapshot_max_threads: int = 0
    """``snapshot.max.threads``: chunks read at once; 0 = Spark's default parallelism."""
    skipped_operations: str = "none"
    """``skipped.operations``: c, u, d, t (comma-separated) or ``none``. Debezium's default
    is ``t``; here truncates are captured by default because silver must honour them."""
    tombstones_on_delete: bool = False
    """``tombstones.on.delete``: add a tombstone row (op null) after each delete in bronze."""
    provide_transaction_metadata: bool = False
    """``provide.transaction.metadata``: BEGIN/END records in ``bronze/_pgcdc/transactions``."""
    heartbeat_interval_ms: int = 0
    """``heartbeat.interval.ms``: > 0 emits a heartbeat message into the WAL at each run, so a
    quiet captured database still has a position for the slot to reach."""
    heartbeat_action_query: str = ""
    """``heartbeat.action.query``: SQL run on the source before each run's windows."""
    column_options: tuple[tuple[str, str], ...] = ()
    """Column options as ``(property, value)`` pairs in Debezium syntax (parsed and checked
    by ``cdc.column_options.ColumnOptions.parse``): ``column.include.list``,
    ``column.exclude.list``, ``column.mask.with.<N>.chars``, ``column.truncate.to.<N>.chars``,
    ``column.mask.hash[.v2].<algorithm>.with.salt.<salt>``, ``column.propagate.source.type``
    and ``message.key.columns`` (CFG-36..38, CFG-46..48)."""

    incremental_chunk_size: int = DEFAULT_INCREMENTAL_CHUNK_SIZE
    """``incremental.snapshot.chunk.size``: rows per incremental-snapshot chunk."""
    signal_data_collection: str = ""
    """``signal.data.collection``: the signalling table ``schema.table`` (empty: none)."""
    incremental_statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS
    """``statement_timeout`` of the statements that run an ``additional-conditions`` filter
    (its check, the chunk queries) or a ``snapshot.select.statement.overrides`` SELECT
    (its check, the snapshot chunk reads); 0: none."""

    def __post_init__(self) -> None:
        # The slot name reaches replication commands, the lakehouse path of the capture's
        # state (<lakehouse>/_pgcdc/<slot>) and the app-transaction ids: refuse what
        # PostgreSQL would refuse, before anything runs, naming the setting.
        if not SLOT_NAME.fullmatch(self.slot):
            raise ConfigurationError(
                f"slot.name (PGCDC_SLOT) {self.slot!r} is not a valid replication slot name: "
                "PostgreSQL allows lower-case letters, digits and '_' only, 1 to 63 characters "
                "(e.g. 'orders_cdc')")
        if self.snapshot_mode not in SNAPSHOT_MODES:
            raise ConfigurationError(
                f"snapshot.mode (PGCDC_SNAPSHOT_MODE) {self.snapshot_mode!r} is not supported; "
                f"use one of {', '.join(SNAPSHOT_MODES)}")
        for what, value, least in (
                ("incremental.snapshot.chunk.size (PGCDC_INCREMENTAL_CHUNK_SIZE)",
                 self.incremental_chunk_size, 1),
                ("PGCDC_INCREMENTAL_STATEMENT_TIMEOUT_MS (0: no timeout)",
                 self.incremental_statement_timeout_ms, 0),
                ("target_file_bytes (PGCDC_TARGET_FILE_BYTES)", self.target_file_bytes,
                 MIN_TARGET_FILE_BYTES),
                # 0 bytes or windows: every run succeeded without reading a change
                ("window_max_bytes", self.window_max_bytes, 1),
                ("max_windows", self.max_windows, 1),
                ("silver_batch_rows", self.silver_batch_rows, 1),
                ("window_max_changes (0: no cap)", self.window_max_changes, 0),
                ("window_portion_changes (0: whole windows)", self.window_portion_changes, 0),
                ("snapshot_chunk_bytes", self.snapshot_chunk_bytes, 1),
                ("snapshot.fetch.size", self.snapshot_fetch_size, 1),
                ("snapshot.max.threads (0: Spark's parallelism)", self.snapshot_max_threads, 0),
                ("snapshot_spark_threshold_rows (0: always Spark)",
                 self.snapshot_spark_threshold_rows, 0),
                ("heartbeat.interval.ms", self.heartbeat_interval_ms, 0)):
            # A chunk size of 0 made an incremental snapshot read no row and report it done.
            if value < least:
                raise ConfigurationError(f"{what} = {value} is out of range: use {least} or more")
        if not self.time_budget_s > 0:
            raise ConfigurationError(f"time_budget_seconds = {self.time_budget_s} is out of "
                                     "range: use a number of seconds above 0")
        if self.publication_autocreate not in PUBLICATION_MODES:
            raise ConfigurationError(
                f"publication.autocreate.mode = {self.publication_autocreate!r} is not "
                f"supported; use one of {', '.join(PUBLICATION_MODES)}")
        self._check_lists()

    def _check_lists(self) -> None:
        """The regular-expression lists and ``skipped.operations``, checked before a run
        creates anything (a bad ``snapshot.include.collection.list`` failed after the
        publication was created, a bad ``skipped.operations`` after the slot too)."""
        # Imported here: bronze_write imports this module (through capture.tables).
        from pgcdc_dagster.capture.bronze_write import parse_skipped_operations
        from pgcdc_dagster.postgres.discovery import compile_patterns

        parse_skipped_operations(self.skipped_operations)
        for value, setting in ((self.include, "PGCDC_TABLES (table.include.list)"),
                               (self.exclude, "table.exclude.list"),
                               (self.snapshot_include, "snapshot.include.collection.list")):
            compile_patterns(value, setting)

    @property
    def app_prefix(self) -> str:
        """Prefix of the Delta app-transaction ids of this capture."""
        return f"pgcdc:{self.slot}"
