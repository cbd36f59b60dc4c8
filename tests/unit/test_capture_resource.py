"""The capture resource maps its fields onto the engine's settings (what a Dagster user sets
is what the engine uses), with the engine's defaults (CFG- items: window bounds)."""

from __future__ import annotations

import dagster as dg
import pytest

from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.resources import CaptureResource

pytestmark = [pytest.mark.unit]

WINDOW_FIELDS = ("window_max_bytes", "window_max_changes", "window_portion_changes",
                 "max_windows")


def test_defaults_equal_the_engine_defaults() -> None:
    got = CaptureResource().settings("dbname=x", "/lake")
    engine = CaptureSettings(dsn="dbname=x", lakehouse="/lake")
    for name in (*WINDOW_FIELDS, "snapshot_chunk_bytes", "snapshot_fetch_size"):
        assert getattr(got, name) == getattr(engine, name), name


def test_window_fields_reach_the_engine() -> None:
    got = CaptureResource(window_max_bytes=1 << 20, window_max_changes=123,
                          window_portion_changes=45, max_windows=6,
                          time_budget_seconds=7.5).settings("dbname=x", "/lake")
    assert (got.window_max_bytes, got.window_max_changes, got.window_portion_changes,
            got.max_windows, got.time_budget_s) == (1 << 20, 123, 45, 6, 7.5)


def test_plugin_name_reaches_the_engine(monkeypatch) -> None:
    """plugin.name: the resource field (PGCDC_PLUGIN_NAME in the shipped definitions) reaches
    the engine; an unsupported name is refused with the supported ones."""
    from pgcdc_dagster.definitions import default_resources
    from pgcdc_dagster.exceptions import ConfigurationError

    assert CaptureResource().settings("dbname=x", "/lake").plugin_name == "pgoutput"
    got = CaptureResource(plugin_name="wal2json").settings("dbname=x", "/lake")
    assert got.plugin_name == "wal2json"
    with pytest.raises(ConfigurationError, match="decoderbufs, wal2json, yboutput"):
        CaptureResource(plugin_name="wal2json_rds").settings("dbname=x", "/lake")
    monkeypatch.setenv("PGCDC_PLUGIN_NAME", "decoderbufs")
    capture = default_resources()["capture"]
    assert isinstance(capture, CaptureResource)
    env = capture.plugin_name
    assert isinstance(env, dg.EnvVar) and env.get_value() == "decoderbufs"


@pytest.mark.parametrize(("env", "value", "message"), [
    ("PGCDC_SNAPSHOT_MODE", "intial", r"snapshot\.mode \(PGCDC_SNAPSHOT_MODE\) 'intial'.*"
     "initial, initial_only"),
    ("PGCDC_PLUGIN_NAME", "pgoutptu", r"'pgoutptu' is not supported.*PGCDC_PLUGIN_NAME"),
    ("PGCDC_SLOT", "Bad-Name", r"PGCDC_SLOT.*'Bad-Name'"),
    ("PGCDC_INCREMENTAL_CHUNK_SIZE", "abc", r"PGCDC_INCREMENTAL_CHUNK_SIZE = 'abc' is not an "
     "integer"),
    ("PGCDC_INCREMENTAL_CHUNK_SIZE", "0", r"\(PGCDC_INCREMENTAL_CHUNK_SIZE\) = 0 is out of "
     "range: use 1 or more"),
    ("PGCDC_INCREMENTAL_STATEMENT_TIMEOUT_MS", "-1", r"TIMEOUT_MS.* = -1 is out of range"),
    ("PGCDC_TOMBSTONE_RETENTION_HOURS", "-1", r"PGCDC_TOMBSTONE_RETENTION_HOURS = -1"),
    ("PGCDC_VACUUM_RETENTION_HOURS", "0", r"PGCDC_VACUUM_RETENTION_HOURS = 0 .*1 or more"),
    ("PGCDC_TARGET_FILE_BYTES", "0", r"\(PGCDC_TARGET_FILE_BYTES\) = 0 .*1024 or more"),
    ("PGCDC_TARGET_FILE_BYTES", "1MiB", r"PGCDC_TARGET_FILE_BYTES = '1MiB' is not a size"),
    ("PGCDC_SPARK_MASTER", "lcal[2]", r"'lcal\[2\]' is not a Spark master URL.*"
     "PGCDC_SPARK_MASTER"),
    ("PGCDC_SIGNAL_DATA_COLLECTION", "signals", r"PGCDC_SIGNAL_DATA_COLLECTION: .*'signals' "
     "is not <schema>.<table>"),
])
def test_a_wrong_variable_fails_the_load_naming_it(monkeypatch, env, value, message) -> None:
    """QA: what a run refused only once it had started (a bad Spark master after creating the
    slot and publication), or never (PGCDC_INCREMENTAL_CHUNK_SIZE=0 made an incremental
    snapshot read no row and report it done), fails the shipped definitions' resources, which
    the code location builds when it loads, with the variable and the fix named."""
    from pgcdc_dagster.definitions import default_resources
    from pgcdc_dagster.exceptions import ConfigurationError

    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigurationError, match=message):
        default_resources()


def test_integer_variables_reach_the_resource(monkeypatch) -> None:
    """Counts as plain integers, PGCDC_TARGET_FILE_BYTES as a size (docs/configuration.md:
    sizes accept kB/MB/GB; it took plain bytes only)."""
    from pgcdc_dagster.definitions import default_resources

    for env, value in (("PGCDC_TARGET_FILE_BYTES", "64kB"), ("PGCDC_INCREMENTAL_CHUNK_SIZE",
                       "8_192"), ("PGCDC_TOMBSTONE_RETENTION_HOURS", "0"),
                       ("PGCDC_SNAPSHOT_MODE", "never")):
        monkeypatch.setenv(env, value)
    capture = default_resources()["capture"]
    assert isinstance(capture, CaptureResource)
    assert (capture.target_file_bytes, capture.incremental_snapshot_chunk_size,
            capture.tombstone_retention_hours) == (64 << 10, 8192, 0)


@pytest.mark.parametrize(("fields", "message"), [
    ({"window_max_bytes": 0}, r"window_max_bytes = 0 is out of range"),
    ({"max_windows": 0}, r"max_windows = 0 is out of range"),
    ({"window_max_changes": -1}, r"window_max_changes \(0: no cap\) = -1"),
    ({"window_portion_changes": -1}, r"window_portion_changes .* = -1"),
    ({"time_budget_seconds": 0}, r"time_budget_seconds = 0"),
    ({"snapshot_max_threads": -1}, r"snapshot\.max\.threads .* = -1"),
    ({"snapshot_fetch_size": 0}, r"snapshot\.fetch\.size = 0"),
    ({"snapshot_chunk_bytes": 0}, r"snapshot_chunk_bytes = 0"),
    ({"heartbeat_interval_ms": -5}, r"heartbeat\.interval\.ms = -5"),
    ({"skipped_operations": "c,x"}, r"skipped\.operations: x unknown"),
    ({"publication_autocreate_mode": "filterd"}, r"publication\.autocreate\.mode = 'filterd'"),
    ({"snapshot_include_collection_list": "("}, r"snapshot\.include\.collection\.list: '\('"),
    ({"exclude_tables": "("}, r"table\.exclude\.list: '\('"),
])
def test_a_wrong_field_is_refused_before_a_run_changes_anything(fields, message) -> None:
    """QA, the capture resource's fields without a variable: a run with 0 window bytes, 0
    windows or a 0 s budget succeeded without ever reading a change; a bad
    skipped.operations, snapshot.max.threads or snapshot.include.collection.list failed
    only after the run had created the slot or the publication. The engine's settings (built
    when a run starts, before it touches the source) refuse each, naming it."""
    from pgcdc_dagster.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match=message):
        CaptureResource(**fields).settings("dbname=x", "/lake")


def test_spark_driver_memory_comes_from_the_environment(monkeypatch) -> None:
    """The Spark heap a large silver batch runs in is settable without code."""
    from pgcdc_dagster.definitions import default_resources

    monkeypatch.setenv("PGCDC_SPARK_DRIVER_MEMORY", "3g")
    assert default_resources()["spark"].driver_memory == "3g"
    monkeypatch.delenv("PGCDC_SPARK_DRIVER_MEMORY")
    assert default_resources()["spark"].driver_memory is None


def test_partial_run_config_keeps_the_configured_values(monkeypatch) -> None:
    """Run config that sets one field of the environment's capture resource keeps the values
    the environment gave the others (a plain resource reset topic_prefix to 'pgcdc', mixing
    two source.name values in one bronze table)."""
    from pgcdc_dagster.definitions import build_definitions

    monkeypatch.setenv("PGCDC_TOPIC_PREFIX", "from_env")
    monkeypatch.setenv("PGCDC_SLOT", "env_slot")
    seen: dict[str, object] = {}

    @dg.op(required_resource_keys={"capture"})
    def look(context) -> None:  # (string annotations: Dagster wants none here)
        capture = context.resources.capture
        seen.update(topic_prefix=capture.topic_prefix, slot=capture.slot,
                    tombstones_on_delete=capture.tombstones_on_delete)

    @dg.job
    def probe() -> None:
        look()

    capture = build_definitions([]).resources["capture"]  # as the code location binds it
    job = dg.Definitions(jobs=[probe], resources={"capture": capture}).resolve_job_def("probe")
    assert job.execute_in_process(run_config={"resources": {"capture": {"config": {
        "tombstones_on_delete": True}}}}).success
    assert seen == {"topic_prefix": "from_env", "slot": "env_slot", "tombstones_on_delete": True}
    assert job.execute_in_process().success
    assert seen == {"topic_prefix": "from_env", "slot": "env_slot", "tombstones_on_delete": False}
