"""The capture resource maps its fields onto the engine's settings (what a Dagster user sets
is what the engine uses), with the engine's defaults (CFG- items: window bounds)."""

from __future__ import annotations

import dagster as dg
import pytest

from pgcdc_dagster.capture.settings import CaptureSettings
from resources import CaptureResource

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
