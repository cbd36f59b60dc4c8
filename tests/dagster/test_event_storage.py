"""The ops that report many events keep the default SQLite event storage cheap (issue 16).

On the default SQLite event storage every write creates an engine (its statements compiled
afresh), opens and closes a connection; when no other connection is open, that close
checkpoints the WAL into the database and deletes it, once per event. Inside
:func:`event_files_held` the run's event file and the index stay open (the WAL survives each
write) and the storage keeps one engine per file; what is stored and what readers see must
not change:

* a run reporting inside the block stores exactly what the same run stores without it: its
  events (types, order, content), the assets' materializations and latest materialization,
  materialized partitions, indexed tags, the checks' execution records and statuses;
* the storage's own methods are back after the block, also after an exception in it, and a
  run started inside a block (its event file created through the shared engines) is stored;
* two processes report at the same time, each inside its block, into one ``DAGSTER_HOME``,
  while a third process reads both runs' events, asset records and check executions before
  either block has closed: everything is there;
* on dagster-postgres's storage one connection is kept for the block instead of one per
  write, and the same is stored as without;
* other storages, and a storage whose private names are not Dagster's own, are left alone.
"""

# No ``from __future__ import annotations``: Dagster reads the op's context annotation.

import contextlib
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg2
import pytest
from dagster._core.event_api import EventLogRecord
from dagster._core.events import StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log import sql_event_log as sql_event_log_module
from dagster._core.storage.event_log.sqlite import sqlite_event_log
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster_shared.serdes import deserialize_value, serialize_value

from pgcdc_dagster.assets import event_batches, event_memo, event_prepack, event_writes
from pgcdc_dagster.assets.event_storage import (
    REPLACED,
    engines_shareable,
    engines_shared,
    event_files_held,
)

EVENTS = 20
TABLES = 6
DATES = ["2024-01-01", "2024-01-02", "2024-01-03"]
ROOT = Path(__file__).resolve().parents[2]


def _wal_files(instance: dg.DagsterInstance, run_id: str) -> list[bool]:
    storage = instance.event_log_storage
    return [os.path.exists(storage.path_for_shard(shard) + "-wal")  # type: ignore[attr-defined]
            for shard in (run_id, "index")]


def _replaced(instance: dg.DagsterInstance) -> list[str]:
    return [name for name in REPLACED if name in vars(instance.event_log_storage)]


def test_event_files_stay_open_while_the_op_reports() -> None:
    seen: dict[str, object] = {}

    @dg.op
    def report(context: dg.OpExecutionContext) -> None:
        instance, run_id = context.instance, context.run_id
        with event_files_held(instance, run_id) as held:
            seen["held"] = held
            seen["replaced"] = _replaced(instance)
            for i in range(EVENTS):
                context.log_event(dg.AssetMaterialization(asset_key=["bronze", "s", f"t{i}"],
                                                          metadata={"events": i}))
                context.log_event(dg.AssetCheckEvaluation(
                    asset_key=dg.AssetKey(["bronze", "s", f"t{i}"]), check_name="c",
                    passed=True))
            seen["inside"] = _wal_files(instance, run_id)
        seen["replaced after"] = _replaced(instance)
        context.log_event(dg.AssetMaterialization(asset_key=["bronze", "s", "after"]))
        seen["after"] = _wal_files(instance, run_id)

    @dg.job
    def reporting() -> None:
        report()

    with dg.instance_for_test() as instance:
        result = reporting.execute_in_process(instance=instance)
        assert result.success
        assert seen["inside"] == [True, True], "a write checkpointed the WAL away"
        assert seen["held"] == 2
        assert seen["replaced"] == list(REPLACED), "the engines were not shared"
        assert seen["replaced after"] == [], "the storage's own methods are not back"
        assert seen["after"] == [False, False], "the files were not released"
        stored = instance.get_records_for_run(result.run_id, limit=1000).records
        kinds = [r.event_log_entry.dagster_event_type for r in stored]
        assert kinds.count(dg.DagsterEventType.ASSET_MATERIALIZATION) == EVENTS + 1
        assert kinds.count(dg.DagsterEventType.ASSET_CHECK_EVALUATION) == EVENTS
        latest = instance.get_latest_materialization_event(dg.AssetKey(["bronze", "s", "t7"]))
        assert latest is not None and latest.asset_materialization is not None
        assert latest.asset_materialization.metadata["events"].value == 7

    with dg.DagsterInstance.ephemeral() as memory:  # not SQLite: nothing is held or replaced
        with event_files_held(memory, "any") as held:
            assert held == 0
            assert _replaced(memory) == []


# ---- the same run with and without the block ------------------------------------------------

def _key(label: str, i: int) -> dg.AssetKey:
    return dg.AssetKey(["bronze", label, f"t{i}"])


def _keys(label: str) -> list[dg.AssetKey]:
    return [_key(label, i) for i in range(TABLES)]


def _shared_key() -> dg.AssetKey:
    return dg.AssetKey(["bronze", "shared", "dates"])


def _check_keys(label: str) -> list[dg.AssetCheckKey]:
    return [dg.AssetCheckKey(_key(label, i), name) for i in range(TABLES)
            for name in ("lsn_windows_contiguous", "schema_matches_source")] + \
        [dg.AssetCheckKey(_shared_key(), "matches_source")]


def report_tables(context: dg.OpExecutionContext, label: str) -> None:
    """What a capture op reports, in all its kinds: materializations with a column schema and
    an indexed tag, partitioned ones (of a key other reporters share), an observation,
    passing and failing checks (one of them a warning, one partitioned) and log lines."""
    schema = dg.TableSchema(columns=[dg.TableColumn("id", "int64", description="key"),
                                     dg.TableColumn("name", "string")])
    for i in range(TABLES):  # packed ahead as the capture does (inside the block only)
        context.log_event(event_prepack.prepack(dg.AssetMaterialization(
            asset_key=_key(label, i), description=f"table {i}",
            metadata={"events": i, "lsn_end": f"0/{i:X}", "dagster/column_schema": schema,
                      "table_uri": dg.MetadataValue.path(f"/lake/{label}/t{i}")},
            tags={"dagster/data_version": f"{label}-{i}"})))
        context.log_event(dg.AssetCheckEvaluation(
            asset_key=_key(label, i), check_name="lsn_windows_contiguous", passed=i != 2,
            metadata={"windows": i}, description="windows"))
        context.log_event(dg.AssetCheckEvaluation(
            asset_key=_key(label, i), check_name="schema_matches_source", passed=True,
            severity=dg.AssetCheckSeverity.WARN if i == 3 else dg.AssetCheckSeverity.ERROR))
        context.log.info(f"table {i} of {label} reported")
    for date in DATES:
        context.log_event(dg.AssetMaterialization(asset_key=_shared_key(), partition=date,
                                                  metadata={"reporter": label}))
    context.log_event(dg.AssetCheckEvaluation(
        asset_key=_shared_key(), check_name="matches_source", passed=False, partition=DATES[0],
        metadata={"reporter": label}))
    context.log_event(dg.AssetObservation(asset_key=["source", "replication_slot"],
                                          metadata={"lag_bytes": 42}))


SEEN: dict[str, object] = {}


class ReportConfig(dg.Config):
    label: str = "s"
    held: bool = True
    wait_dir: str = ""


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


@dg.op
def report(context: dg.OpExecutionContext, config: ReportConfig) -> None:
    held = event_files_held(context.instance, context.run_id) if config.held \
        else contextlib.nullcontext(0)
    with held:
        SEEN["memo"] = sql_event_log_module.serialize_value is not serialize_value
        SEEN["replaced"] = sorted(vars(context.instance.event_log_storage).keys() &
                                  {"store_event", "has_table",
                                   "_has_asset_key_index_cols_on_connection"})
        engine = getattr(context.instance.event_log_storage, "_engine", None)
        SEEN["postgres pool"] = type(engine.pool).__name__ if engine is not None else None
        if config.wait_dir:  # both reporters inside their blocks before either reports
            wait = Path(config.wait_dir)
            (wait / f"ready_{config.label}").touch()
            for other in ("a", "b"):
                _wait_for(wait / f"ready_{other}")
        report_tables(context, config.label)
        if config.wait_dir:  # stay in the block until the reader has read
            (wait / f"reported_{config.label}").touch()
            _wait_for(wait / "read")


@dg.job
def reporting() -> None:
    report()


def _run(instance: dg.DagsterInstance, **config: Any) -> str:
    result = reporting.execute_in_process(
        instance=instance, run_config={"ops": {"report": {"config": config}}})
    assert result.success
    return result.run_id


def _event_view(entry: EventLogEntry) -> tuple[Any, ...]:
    """An event without what differs between two runs of the same job (ids, times, pids)."""
    event = entry.dagster_event
    if event is None:
        return ("log", entry.level, entry.user_message)
    if event.is_step_materialization:
        m = event.step_materialization_data.materialization
        return (event.event_type_value, event.step_key, m.asset_key, m.partition, m.description,
                dict(m.metadata), dict(m.tags or {}))
    if event.is_asset_observation:
        o = event.asset_observation_data.asset_observation
        return (event.event_type_value, event.step_key, o.asset_key, dict(o.metadata))
    if event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
        c = event.asset_check_evaluation_data
        return (event.event_type_value, event.step_key, c.asset_key, c.check_name, c.passed,
                c.severity, c.partition, c.description, dict(c.metadata))
    return (event.event_type_value, event.step_key)


def _stored(instance: dg.DagsterInstance, run_id: str, label: str) -> dict[str, Any]:
    """Everything a reader (the UI) reads of one reporting run."""
    keys = _keys(label)
    checks = _check_keys(label)
    storage = instance.event_log_storage
    latest_checks = storage.get_latest_asset_check_execution_by_key(checks)
    records = instance.get_asset_records(keys)
    return {
        "events": [_event_view(r.event_log_entry)
                   for r in instance.get_records_for_run(run_id, limit=10_000).records],
        "materializations": {
            key.to_user_string(): [_event_view(r.event_log_entry) for r in
                                   instance.fetch_materializations(key, limit=100).records]
            for key in [*keys, _shared_key()]},
        "latest": {key.to_user_string(): _event_view(e) if e is not None else None
                   for key in keys
                   for e in [instance.get_latest_materialization_event(key)]},
        "asset records last run": {r.asset_entry.asset_key.to_user_string():
                                   r.asset_entry.last_run_id == run_id for r in records},
        "asset keys": sorted(k.to_user_string() for k in instance.get_asset_keys()),
        "partitions": sorted(instance.get_materialized_partitions(_shared_key())),
        "tags": {key.to_user_string(): list(instance.get_event_tags_for_asset(key))
                 for key in keys},
        "check executions": {
            f"{k.asset_key.to_user_string()}:{k.name}": [
                (r.status, r.partition, r.run_id == run_id,
                 _event_view(r.event) if r.event is not None else None)
                for r in storage.get_asset_check_execution_history(k, limit=10)]
            for k in checks},
        "check status": {f"{k.asset_key.to_user_string()}:{k.name}": latest_checks[k].status
                         for k in checks if k in latest_checks},
    }


def _expected_shape(stored: dict[str, Any], label: str) -> None:
    """What a reporting run must have stored, whatever the block (so that a comparison of two
    equally broken runs cannot pass)."""
    kinds = [e[0] for e in stored["events"]]
    assert kinds.count("ASSET_MATERIALIZATION") == TABLES + len(DATES)
    assert kinds.count("ASSET_CHECK_EVALUATION") == 2 * TABLES + 1
    assert kinds.count("ASSET_OBSERVATION") == 1
    assert kinds[0] == "PIPELINE_START" and kinds[-1] == "PIPELINE_SUCCESS"
    assert stored["partitions"] == DATES
    assert {k.to_user_string() for k in [*_keys(label), _shared_key()]} <= \
        set(stored["asset keys"]), "an asset materialized after a wipe does not show"
    assert all(stored["asset records last run"].values())
    assert len(stored["asset records last run"]) == TABLES
    for i in range(TABLES):
        name = _key(label, i).to_user_string()
        assert stored["latest"][name][5]["events"].value == i
        assert stored["tags"][name] == [{"dagster/data_version": f"{label}-{i}"}]
        windows = stored["check status"][f"{name}:lsn_windows_contiguous"]
        assert windows == (AssetCheckExecutionRecordStatus.FAILED if i == 2 else
                           AssetCheckExecutionRecordStatus.SUCCEEDED)
    shared = stored["check executions"][f"{_shared_key().to_user_string()}:matches_source"]
    assert [(s, p) for s, p, *_ in shared][:1] == \
        [(AssetCheckExecutionRecordStatus.FAILED, DATES[0])]


def _wiped_before(instance: dg.DagsterInstance) -> dg.DagsterInstance:
    """An asset of the run materialized and wiped before it: the run must bring it back."""
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=_key("s", 0)))
    instance.wipe_assets([_key("s", 0)])
    assert _key("s", 0) not in instance.get_asset_keys()
    return instance


def test_a_run_inside_the_block_stores_what_it_stores_without(
        monkeypatch: pytest.MonkeyPatch) -> None:
    prepared: list[str] = []
    store = event_writes.PreparedWrites.store_event

    def counted(self: event_writes.PreparedWrites, event: EventLogEntry) -> None:
        prepared.append(event.dagster_event_type or "log")
        store(self, event)

    monkeypatch.setattr(event_writes.PreparedWrites, "store_event", counted)
    composed: list[str] = []
    entry_text = event_prepack.entry_text

    def counted_text(entry: EventLogEntry) -> str | None:
        text = entry_text(entry)
        if text is not None:
            composed.append(text)
        return text

    monkeypatch.setattr(event_prepack, "entry_text", counted_text)
    with dg.instance_for_test() as plain, dg.instance_for_test() as held:
        _wiped_before(plain)
        _wiped_before(held)
        plain_run = _run(plain, held=False)
        assert prepared == []
        held_run = _run(held, held=True)
        without = _stored(plain, plain_run, "s")
        within = _stored(held, held_run, "s")
        assert SEEN["memo"], "each event was serialized as often as before"
        _expected_shape(without, "s")
        assert within == without
        assert _replaced(held) == []
        for instance in (plain, held):
            with _sqlite_index(instance) as conn:
                _serialized_as_dagster_does(conn)
        # the statements built once (assets/event_writes.py) wrote the materializations and
        # check evaluations, and every row of both files is the one Dagster's own path writes
        assert sorted(set(prepared)) == [dg.DagsterEventType.ASSET_CHECK_EVALUATION,
                                         dg.DagsterEventType.ASSET_MATERIALIZATION]
        assert len(prepared) == TABLES + len(DATES) + 2 * TABLES + 1
        assert _rows_as_stored(held, held_run) == _rows_as_stored(plain, plain_run)
        assert len(composed) == TABLES, "the materializations packed ahead were packed again"
        assert event_prepack._packed == {}


def _rows_as_stored(instance: dg.DagsterInstance, run_id: str) -> dict[str, list[Any]]:
    """Every row of the index and the run's event file, column by column, with what differs
    between two runs of the same job on two fresh instances (the run's id, numbers: times,
    pids, durations; the compute logs' random key) masked: the columns written,
    NULLs, texts (event texts as stored, not parsed) and the shape of each stored datetime
    stay."""
    storage: Any = instance.event_log_storage
    out: dict[str, list[Any]] = {}
    for shard in ("index", run_id):
        conn = sqlite3.connect(storage.path_for_shard(shard))
        try:
            tables = [name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                "'sqlite%' AND name <> 'alembic_version' ORDER BY name")]
            for table in tables:
                cur = conn.execute(f'SELECT * FROM "{table}" ORDER BY rowid')
                names = [d[0] for d in cur.description]
                out[f"{'run' if shard == run_id else shard}.{table}"] = [
                    [(name, _masked(value, run_id)) for name, value in zip(names, row,
                                                                          strict=True)]
                    for row in cur.fetchall()]
        finally:
            conn.close()
    return out


def _masked(value: Any, run_id: str) -> Any:
    if isinstance(value, str):
        value = re.sub(r'"log_key": "\w+"', '"log_key": "KEY"', value.replace(run_id, "RUN"))
        value = re.sub(r"in [\d.]+m?s\b", "in T", value)  # durations: in 9ms, in 1.2s
        return re.sub(r"\d+", "0", value)
    return type(value).__name__ if isinstance(value, int | float) else value


def _postgres_instance(dsn: str) -> contextlib.AbstractContextManager[dg.DagsterInstance]:
    """An instance whose storage is dagster-postgres (as ``dagster.yaml.example``'s)."""
    parts = dict(part.split("=", 1) for part in dsn.split())
    auth = parts.get("user", "postgres") + \
        (f":{parts['password']}" if parts.get("password") else "")
    url = (f"postgresql+psycopg2://{auth}@{parts.get('host', '127.0.0.1')}:"
           f"{parts.get('port', '5432')}/{parts['dbname']}")
    return dg.instance_for_test(overrides={"storage": {"postgres": {"postgres_url": url}}})


class DropConfig(dg.Config):
    dsn: str


@dg.op
def report_across_a_dropped_connection(context: dg.OpExecutionContext,
                                       config: DropConfig) -> None:
    """The server closes the kept connection between two events (a restart, an idle timeout
    of a proxy): the next event is stored all the same."""
    with event_files_held(context.instance, context.run_id):
        context.log_event(dg.AssetMaterialization(asset_key=["bronze", "drop", "before"]))
        conn = psycopg2.connect(config.dsn)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()")
                SEEN["terminated"] = cur.fetchone()[0]  # type: ignore[index]
        finally:
            conn.close()
        context.log_event(dg.AssetMaterialization(asset_key=["bronze", "drop", "after"]))


@dg.job
def dropped_connection() -> None:
    report_across_a_dropped_connection()


@pytest.mark.integration
def test_on_postgres_a_connection_is_kept_and_the_same_is_stored(pg_dsn: str,
                                                                  second_pg_dsn: str) -> None:
    with _postgres_instance(pg_dsn) as plain, _postgres_instance(second_pg_dsn) as held:
        _wiped_before(plain)
        _wiped_before(held)
        without = _stored(plain, _run(plain, held=False), "s")
        within = _stored(held, _run(held, held=True), "s")
        assert SEEN["memo"], "each event was serialized as often as before"
        assert SEEN["replaced"] == ["_has_asset_key_index_cols_on_connection", "has_table",
                                    "store_event"], "the answers were not kept"
        assert SEEN["postgres pool"] == "QueuePool", "no connection was kept"
        _expected_shape(without, "s")
        assert within == without
        for dsn in (pg_dsn, second_pg_dsn):
            with contextlib.closing(psycopg2.connect(dsn)) as conn:
                _serialized_as_dagster_does(conn)
        engine = getattr(held.event_log_storage, "_engine", None)
        assert engine is not None and type(engine.pool).__name__ == "NullPool", \
            "dagster-postgres's own engine is not back"
        with event_files_held(held, "any") as files:  # no SQLite file on this storage
            assert files == 0
        result = dropped_connection.execute_in_process(
            instance=held, run_config={"ops": {"report_across_a_dropped_connection": {
                "config": {"dsn": second_pg_dsn}}}})
        assert result.success and SEEN["terminated"], "the kept connection was not closed"
        assert held.get_latest_materialization_event(dg.AssetKey(["bronze", "drop", "after"]))


def test_the_storage_is_restored_after_the_block_even_on_error() -> None:
    with dg.instance_for_test() as instance:
        storage = instance.event_log_storage
        assert isinstance(storage, SqliteEventLogStorage)
        with engines_shared(instance) as shared:
            assert shared and _replaced(instance) == list(REPLACED)
            # a run started inside: its new event file is created through the shared engine
            run_id = _run(instance, held=False, label="inside")
            with engines_shared(instance) as nested:  # an enclosing block already shares
                assert not nested
            assert _replaced(instance) == list(REPLACED)
        assert _replaced(instance) == []
        assert type(storage)._connect is SqliteEventLogStorage._connect
        _expected_shape(_stored(instance, run_id, "inside"), "inside")

        with pytest.raises(RuntimeError, match="boom"), \
                event_files_held(instance, run_id) as held:
            assert held == 2 and _replaced(instance) == list(REPLACED)
            raise RuntimeError("boom")
        assert _replaced(instance) == []
        assert not os.path.exists(storage.path_for_shard(run_id) + "-wal"), "file still held"
        # Dagster's own path writes to that storage as before
        assert _stored(instance, _run(instance, held=False, label="after"), "after")


def test_storages_not_dagsters_own_are_left_alone(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    class Overridden(SqliteEventLogStorage):
        @contextlib.contextmanager
        def _connect(self, shard: str) -> Iterator[Any]:
            with super()._connect(shard) as conn:
                yield conn

    assert not engines_shareable(Overridden(str(tmp_path / "events")))
    assert engines_shareable(SqliteEventLogStorage(str(tmp_path / "own")))
    monkeypatch.delattr(sqlite_event_log, "SQLITE_BUSY_TIMEOUT_SECONDS")  # renamed upstream
    assert not engines_shareable(SqliteEventLogStorage(str(tmp_path / "own")))


# ---- two reporting processes and a reader, one DAGSTER_HOME ----------------------------------

def _reporter(home: Path, label: str, wait: Path) -> subprocess.Popen[str]:
    code = ("import sys; import dagster as dg; "
            "from tests.dagster.test_event_storage import _run; "
            "instance = dg.DagsterInstance.get(); "
            "print('RUN', _run(instance, held=True, label=sys.argv[1], wait_dir=sys.argv[2]))")
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code, label, str(wait)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_ids(instance: dg.DagsterInstance) -> dict[str, str]:
    return {r.run_config["ops"]["report"]["config"]["label"]: r.run_id  # type: ignore[index]
            for r in instance.get_runs()}


def test_two_processes_report_at_once_while_a_third_reads(tmp_path: Path) -> None:
    home, wait = tmp_path / "home", tmp_path / "wait"
    home.mkdir()
    wait.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.from_config(str(home)) as instance:  # the index exists first
        assert isinstance(instance.event_log_storage, SqliteEventLogStorage)
    procs = {label: _reporter(home, label, wait) for label in ("a", "b")}
    try:
        for label, proc in procs.items():
            deadline = time.monotonic() + 300
            while not (wait / f"reported_{label}").exists():
                assert proc.poll() is None, proc.communicate()[1][-3000:]
                assert time.monotonic() < deadline, f"reporter {label} never reported"
                time.sleep(0.1)
        # both blocks are open now: this process reads what they stored
        with dg.DagsterInstance.from_config(str(home)) as reader:
            runs = _run_ids(reader)
            while_open = {label: _stored(reader, runs[label], label) for label in ("a", "b")}
        (wait / "read").touch()
        outputs = {label: proc.communicate(timeout=300) for label, proc in procs.items()}
    finally:
        (wait / "read").touch()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    for label, (out, err) in outputs.items():
        assert procs[label].returncode == 0, err[-3000:]
        assert f"RUN {runs[label]}" in out
    with dg.DagsterInstance.from_config(str(home)) as after:
        for label in ("a", "b"):
            stored = _stored(after, runs[label], label)
            _expected_shape(stored, label)
            # everything but the run's last events was there while the blocks were open
            opened = while_open[label]
            assert opened["events"] == stored["events"][:len(opened["events"])]
            assert [e for e in opened["events"] if e[0] != "log"][-1][0] == \
                "ASSET_OBSERVATION"
            assert {k: v for k, v in opened.items() if k != "events"} == \
                {k: v for k, v in stored.items() if k != "events"}
        shared = after.fetch_materializations(_shared_key(), limit=100).records
        assert sorted(r.asset_materialization.metadata["reporter"].value  # type: ignore[union-attr]
                      for r in shared) == sorted(["a", "b"] * len(DATES))


# ---- batched commits: what another process sees, and when -----------------------------------

def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return home


def _seen_by(reader: dg.DagsterInstance, run_id: str) -> list[str]:
    """The run's events another connection (process) reads: materialized keys, check names
    and log lines, in order."""
    out = []
    for record in reader.get_records_for_run(run_id, limit=10_000).records:
        entry = record.event_log_entry
        if entry.dagster_event is None:
            out.append(entry.user_message)
        elif entry.dagster_event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            out.append(entry.dagster_event.asset_key.path[-1])  # type: ignore[union-attr]
        elif entry.dagster_event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            out.append(entry.dagster_event.asset_check_evaluation_data.check_name)
    return out


class BatchConfig(dg.Config):
    home: str


BATCH_SEEN: dict[str, Any] = {}


@dg.op
def report_in_batches(context: dg.OpExecutionContext, config: BatchConfig) -> None:
    """Logs in the kinds that are batched and not, looking after each step at what this
    process and another reader (a second instance: its own connections) see."""
    seen = BATCH_SEEN
    with dg.DagsterInstance.from_config(config.home) as other:
        def now(label: str, started: float) -> None:
            seen[label] = (_seen_by(other, context.run_id),
                           time.monotonic() - started < event_batches.BATCH_SECONDS)

        with event_files_held(context.instance, context.run_id):
            started = time.monotonic()
            for i in range(3):
                context.log_event(dg.AssetMaterialization(asset_key=["bronze", "b", f"m{i}"]))
            latest = context.instance.get_latest_materialization_event(
                dg.AssetKey(["bronze", "b", "m2"]))
            seen["own process"] = latest is not None and latest.run_id == context.run_id
            now("3 materializations", started)
            context.log.info("a log line")  # not batched: committed with all before it
            seen["after the log line"] = _seen_by(other, context.run_id)
            started = time.monotonic()
            for i in range(event_batches.BATCH_EVENTS + 2):
                context.log_event(dg.AssetCheckEvaluation(
                    asset_key=dg.AssetKey(["bronze", "b", "m0"]), check_name=f"c{i}",
                    passed=True))
            now("BATCH_EVENTS + 2 evaluations", started)
            deadline = time.monotonic() + 60  # the flusher commits the last two by age
            while "c6" not in _seen_by(other, context.run_id) and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["by age"] = _seen_by(other, context.run_id)
            # Dagster's store fails inside the index's transaction: only its own writes there
            # are undone (the event's row in the run's file stays, as on Dagster's own path)
            storage: Any = context.instance.event_log_storage
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(type(storage), "_store_asset_event_tags",
                              lambda *_: (_ for _ in ()).throw(OSError("disk full")))
                with pytest.raises(OSError, match="disk full"):
                    context.log_event(dg.AssetMaterialization(asset_key=["bronze", "b", "x"]))
            context.log_event(dg.AssetMaterialization(asset_key=["bronze", "b", "last"]))
            seen["replaced"] = _replaced(context.instance)
            raise RuntimeError("the op fails inside the block")


@dg.job
def batching() -> None:
    report_in_batches()


def test_batches_are_committed_by_count_age_kind_and_at_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_batches, "BATCH_EVENTS", 5)
    monkeypatch.setattr(event_batches, "BATCH_SECONDS", 3.0)
    home = _home(tmp_path)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        result = batching.execute_in_process(
            instance=instance, raise_on_error=False,
            run_config={"ops": {"report_in_batches": {"config": {"home": str(home)}}}})
        assert not result.success
        seen = BATCH_SEEN
        assert seen["own process"], "a read in the reporting process missed its own write"
        other, young = seen["3 materializations"]
        if young:  # read before the flusher could commit them
            assert other == [], "materializations were committed one by one"
        assert seen["after the log line"] == ["m0", "m1", "m2", "a log line"]
        other, young = seen["BATCH_EVENTS + 2 evaluations"]
        if young:
            assert other == ["m0", "m1", "m2", "a log line", "c0", "c1", "c2", "c3", "c4"]
        assert seen["by age"][-2:] == ["c5", "c6"], "the flusher never committed"
        assert seen["replaced"] == list(REPLACED)
        assert _replaced(instance) == []
        assert sql_event_log_module.serialize_value is serialize_value, \
            "Dagster's serialize_value is not back"
        # everything logged before the op raised is stored, in order (the failed store too:
        # its row in the run's file, as Dagster's own path leaves it)
        with dg.DagsterInstance.from_config(str(home)) as reader:
            assert _seen_by(reader, result.run_id) == [
                "m0", "m1", "m2", "a log line", *[f"c{i}" for i in range(7)], "x", "last"]
            assert reader.get_latest_materialization_event(
                dg.AssetKey(["bronze", "b", "last"])) is not None
            assert reader.fetch_materializations(dg.AssetKey(["bronze", "b", "x"]),
                                                 limit=5).records == [], \
                "the failed store's index rows were not undone"
            executions = reader.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(dg.AssetKey(["bronze", "b", "m0"]), "c6"), limit=5)
            assert [e.status for e in executions] == [AssetCheckExecutionRecordStatus.SUCCEEDED]


class KillConfig(dg.Config):
    wait_dir: str


@dg.op
def report_then_hang(context: dg.OpExecutionContext, config: KillConfig) -> None:
    with event_files_held(context.instance, context.run_id):
        for i in range(3):
            context.log_event(dg.AssetMaterialization(asset_key=["bronze", "k", f"m{i}"]))
        context.log.info("committed")
        for i in range(2):
            context.log_event(dg.AssetMaterialization(asset_key=["bronze", "k", f"p{i}"]))
        Path(config.wait_dir, "run_id").write_text(context.run_id)
        time.sleep(600)  # killed here, two materializations uncommitted


@dg.job
def hanging() -> None:
    report_then_hang()


def test_a_killed_process_loses_only_its_open_batch(tmp_path: Path) -> None:
    home, wait = _home(tmp_path), tmp_path / "wait"
    wait.mkdir()
    code = ("import sys; import dagster as dg; from assets import event_batches; "
            "event_batches.BATCH_SECONDS = 600.0; "
            "from tests.dagster.test_event_storage import hanging; "
            "hanging.execute_in_process(instance=dg.DagsterInstance.get(), run_config="
            "{'ops': {'report_then_hang': {'config': {'wait_dir': sys.argv[1]}}}})")
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(wait)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (wait / "run_id").exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the reporter never reported"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.communicate()
    run_id = (wait / "run_id").read_text()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        # exactly what was committed: the events up to the log line, none half-written
        assert _seen_by(instance, run_id) == ["m0", "m1", "m2", "committed"]
        for name, stored in (("m2", True), ("p0", False), ("p1", False)):
            latest = instance.get_latest_materialization_event(dg.AssetKey(["bronze", "k", name]))
            assert (latest is not None) is stored, name
        # the files are whole: the next run stores everything
        _expected_shape(_stored(instance, _run(instance, held=True, label="next"), "next"),
                        "next")


def _raw_rows(conn: Any) -> tuple[dict[int, str], list[Any], list[Any]]:
    """The event texts by id, latest materializations and check executions an index holds
    (a DB-API connection to the SQLite index file or the PostgreSQL database), as stored:
    text, not deserialized."""
    cur = conn.cursor()
    cur.execute("SELECT id, event FROM event_logs")
    events = dict(cur.fetchall())
    cur.execute("SELECT last_materialization FROM asset_keys "
                "WHERE last_materialization IS NOT NULL")
    latest = cur.fetchall()
    cur.execute("SELECT evaluation_event_storage_id, evaluation_event FROM "
                "asset_check_executions WHERE evaluation_event IS NOT NULL")
    checks = cur.fetchall()
    cur.close()
    return events, latest, checks


def _sqlite_index(instance: dg.DagsterInstance) -> contextlib.closing[sqlite3.Connection]:
    path = instance.event_log_storage.path_for_shard("index")  # type: ignore[attr-defined]
    return contextlib.closing(sqlite3.connect(path))


def _serialized_as_dagster_does(conn: Any) -> None:
    """Each stored copy of an event is the text of that event (no other event's, no stale
    one): the latest materialization is exactly Dagster's serialization of its record."""
    events, latest, checks = _raw_rows(conn)
    assert latest and checks
    for (text,) in latest:
        record = deserialize_value(text, EventLogRecord)
        assert serialize_value(record) == text
        assert text == ('{"__class__": "EventLogRecord", "event_log_entry": '
                        f'{events[record.storage_id]}, "storage_id": {record.storage_id}}}')
    for storage_id, text in checks:
        assert text == events[storage_id]


def test_each_event_is_serialized_once_and_only_as_dagster_would(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counting(val: Any, *args: Any, **kwargs: Any) -> str:
        calls.append(type(val).__name__)
        return serialize_value(val, *args, **kwargs)

    monkeypatch.setattr(event_memo, "_serialize_value", counting)
    monkeypatch.setattr(sql_event_log_module, "serialize_value", counting)
    monkeypatch.setattr(event_memo, "_record_checked", None)
    entry = EventLogEntry(error_info=None, level=20, user_message="m", run_id="r",
                          timestamp=time.time(), step_key=None, job_name="j",
                          dagster_event=None)
    other = entry._replace(user_message="other")
    records = [EventLogRecord(storage_id=i, event_log_entry=entry) for i in (3, 4)]

    def storage_serializes(val: Any) -> str:
        return sql_event_log_module.serialize_value(val)  # as Dagster's storage calls it

    with event_memo.memo_installed() as installed:
        assert installed
        with event_memo.serialized_once(entry):
            texts = [storage_serializes(v) for v in (entry, records[0], entry, records[1])]
            assert storage_serializes(other) == serialize_value(other)  # not the one stored
        assert texts == [serialize_value(v) for v in (entry, records[0], entry, records[1])]
        assert calls == ["EventLogEntry", "EventLogRecord", "EventLogEntry"], \
            "serialized more than once (the record: once per process, to check it)"
        storage_serializes(entry)  # outside the store: Dagster's own
        assert calls[-1] == "EventLogEntry"
    assert sql_event_log_module.serialize_value is counting, "not put back"

    # a record text unlike Dagster's is never used: the check falls back to Dagster's
    monkeypatch.setattr(event_memo, "_record_checked", None)
    monkeypatch.setattr(event_memo, "_record_text", lambda storage_id, text: "wrong")
    with event_memo.memo_installed(), event_memo.serialized_once(entry):
        assert storage_serializes(records[1]) == serialize_value(records[1])
    assert event_memo._record_checked is False


def test_a_materialization_packed_ahead_is_serialized_as_dagster_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def entry(label: str) -> tuple[dg.AssetMaterialization, EventLogEntry]:
        materialization = dg.AssetMaterialization(asset_key=["bronze", "p", label], metadata={
            "events": 3, "dagster/column_schema": dg.TableSchema(columns=[
                dg.TableColumn("id", "int64", description="key",
                               constraints=dg.TableColumnConstraints(nullable=False))]),
            "table_uri": dg.MetadataValue.path("/lake/p")})
        return materialization, EventLogEntry(
            error_info=None, level=10, user_message="m", run_id="r", timestamp=time.time(),
            step_key="s", job_name="j", dagster_event=dg.DagsterEvent(
                event_type_value="ASSET_MATERIALIZATION", job_name="j",
                event_specific_data=StepMaterializationData(materialization)))

    monkeypatch.setattr(event_prepack, "_checked", None)
    before, outside = entry("outside")
    event_prepack.prepack(before)  # outside a memo block: nothing kept
    assert event_prepack._packed == {}
    with event_memo.memo_installed():
        packed, inside = entry("inside")
        event_prepack.prepack(packed)
        assert event_prepack.entry_text(inside) == serialize_value(inside)
        assert event_prepack._checked is True and event_prepack._packed == {}, "not taken"
        assert event_prepack.entry_text(outside) is None  # not packed ahead: Dagster's own
        unused, _ = entry("never logged")
        event_prepack.prepack(unused)
        assert event_prepack._packed
    assert event_prepack._packed == {}, "kept after the last block"

    # a composition unlike Dagster's is never used, nor anything packed after it
    monkeypatch.setattr(event_prepack, "_checked", None)
    with event_memo.memo_installed():
        wrong, wrong_entry = entry("wrong")
        event_prepack.prepack(wrong)
        event_prepack._packed[id(wrong)] = (wrong, {"__class__": "Other"})
        assert event_prepack.entry_text(wrong_entry) is None
        assert event_prepack._checked is False
        later, later_entry = entry("later")
        event_prepack.prepack(later)
        assert event_prepack._packed == {} and event_prepack.entry_text(later_entry) is None


@dg.op
def report_past_a_locked_index(context: dg.OpExecutionContext) -> None:
    """Another process holds the index's write lock longer than the busy timeout: that event
    fails as on Dagster's own path (its row in the run's file stays), the next is stored."""
    storage: Any = context.instance.event_log_storage
    with event_files_held(context.instance, context.run_id):
        context.log_event(dg.AssetMaterialization(asset_key=["bronze", "l", "before"]))
        other = sqlite3.connect(storage.path_for_shard("index"), isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(Exception, match="locked"):
                context.log_event(dg.AssetMaterialization(asset_key=["bronze", "l", "locked"]))
        finally:
            other.execute("ROLLBACK")
            other.close()
        context.log_event(dg.AssetMaterialization(asset_key=["bronze", "l", "after"]))


@dg.job
def locked_index() -> None:
    report_past_a_locked_index()


def test_a_write_lock_held_past_the_busy_timeout_fails_one_event(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_event_log, "SQLITE_BUSY_TIMEOUT_SECONDS", 0.5)
    home = _home(tmp_path)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        result = locked_index.execute_in_process(instance=instance)
        assert result.success
        assert _seen_by(instance, result.run_id) == ["before", "locked", "after"]
        for name, stored in (("before", True), ("locked", False), ("after", True)):
            records = instance.fetch_materializations(dg.AssetKey(["bronze", "l", name]),
                                                      limit=5).records
            assert bool(records) is stored, name
