"""Incremental-snapshot signals (Debezium names and payloads) from both channels: the
signalling table in the source, and Dagster run config (``signal_from_config``)."""

from __future__ import annotations

import pytest

from pgcdc_dagster.capture.incremental import apply_signal, run_incremental, signal_from_config
from pgcdc_dagster.capture.incremental_state import ProgressStore
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.cdc.dblog import SignalError, parse_signal
from pgcdc_dagster.exceptions import ConfigurationError
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.postgres.signals import create_signal_table, read_signals

pytestmark = [pytest.mark.integration]

SCHEMA = """
CREATE TABLE orders (id int PRIMARY KEY, region text, total int, code int);
INSERT INTO orders SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g, 1000 - g
    FROM generate_series(1, 200) g;
"""


@pytest.fixture
def settings(pg_dsn, pg_conn, lakehouse) -> CaptureSettings:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
        cur.execute("CREATE PUBLICATION sig FOR TABLE orders")
        cur.execute("SELECT pg_create_logical_replication_slot('sig', 'pgoutput')")
    return CaptureSettings(dsn=pg_dsn, lakehouse=str(lakehouse), include=(r"public\.orders",),
                           slot="sig", publication="sig")


def _bronze_keys(lakehouse) -> set[int]:
    from deltalake import DeltaTable

    data = DeltaTable(table_uri(str(lakehouse), "bronze", "public", "orders")).to_pyarrow_table(
        columns=["after", "op"])
    return {row["after"]["id"] for row in data.to_pylist() if row["op"] == "r"}


def test_signal_table_channel_with_additional_conditions(settings, pg_conn, lakehouse) -> None:
    create_signal_table(pg_conn, "public.debezium_signal")
    with pg_conn.cursor() as cur:
        cur.execute("""INSERT INTO debezium_signal VALUES ('ad-hoc-1', 'execute-snapshot',
            '{"data-collections": ["public.orders"], "type": "incremental",
              "additional-conditions": [{"data-collection": "public.orders",
                                         "filter": "region = ''eu'' AND total > 100"}]}')""")
    rows = read_signals(pg_conn, "public.debezium_signal")
    assert [r.id for r in rows] == ["ad-hoc-1"]
    outcome = apply_signal(settings, parse_signal(rows[0].id, rows[0].type, rows[0].data),
                           chunk_size=16)
    assert outcome.tables == ["public.orders"]
    report = run_incremental(settings)
    assert report.tables[0].status == "done"
    assert _bronze_keys(lakehouse) == {i for i in range(101, 201) if i % 2 == 0}


def test_surrogate_key_and_dagster_channel(settings, lakehouse) -> None:
    sig = signal_from_config("run-1", "execute-snapshot",
                             {"data-collections": ["public\\.ord.*"], "surrogate-key": "code"})
    outcome = apply_signal(settings, sig, chunk_size=50)
    assert outcome.note == "snapshot requested"
    report = run_incremental(settings)
    assert report.tables[0].chunks_done == 4
    assert _bronze_keys(lakehouse) == set(range(1, 201))
    # QA: an entry that matches no captured table is named, the others still start (it
    # was dropped without a word); when none matches, each entry is named.
    typo = apply_signal(settings, signal_from_config("run-3", "execute-snapshot", {
        "data-collections": ["public.orders", "public.order", 'x."y z"']}))
    assert typo.tables == ["public.orders"]
    assert typo.note == ("snapshot requested; no captured table matches 'public.order', "
                         "'x.\"y z\"' (left out)")
    none = apply_signal(settings, signal_from_config("run-4", "execute-snapshot", {
        "data-collections": ["public.nope"]}))
    assert (none.tables, none.note) == ([], "no captured table matches 'public.nope'")
    with pytest.raises(ConfigurationError, match="surrogate-key 'nope'"):
        apply_signal(settings, signal_from_config("run-2", "execute-snapshot", {
            "data-collections": ["public.orders"], "surrogate-key": "nope"}))


def test_pause_resume_stop(settings, lakehouse) -> None:
    store = ProgressStore(settings.lakehouse, settings.slot)
    apply_signal(settings, parse_signal("1", "execute-snapshot",
                                        '{"data-collections": ["public.orders"]}'), chunk_size=10)
    apply_signal(settings, parse_signal("2", "pause-snapshot", None))
    assert store.load("public", "orders").status == "paused"  # type: ignore[union-attr]
    report = run_incremental(settings)
    assert report.tables[0].chunks_done == 0
    apply_signal(settings, parse_signal("3", "resume-snapshot", ""))
    assert store.load("public", "orders").status == "running"  # type: ignore[union-attr]
    apply_signal(settings, parse_signal("4", "stop-snapshot",
                                        '{"data-collections": ["public.orders"]}'))
    assert store.load("public", "orders").status == "stopped"  # type: ignore[union-attr]
    assert run_incremental(settings).tables[0].chunks_done == 0
    apply_signal(settings, parse_signal("5", "execute-snapshot",
                                        '{"data-collections": ["public.orders"]}'), chunk_size=64)
    report = run_incremental(settings)
    assert (report.tables[0].status, report.tables[0].chunks_done) == ("done", 4)


@pytest.mark.parametrize(("condition", "reason"), [
    ("total > 1; DELETE FROM orders", "';' is not allowed"),
    ("total > 1) OR (true", "parser rejected it: syntax error"),
    ("pg_terminate_backend(pg_backend_pid())", "function pg_terminate_backend is not allowed"),
    ("set_config('default_transaction_read_only', 'off', false) = 'off'",
     "function set_config is not allowed"),
    ("pg_logical_emit_message(true, 'x', 'y') IS NOT NULL",
     "function pg_logical_emit_message is not allowed"),
    ('"pg_terminate_backend"(1)', "function pg_terminate_backend is not allowed"),
    ("id IN (SELECT id FROM orders)", "a sub-query is not allowed"),
    ("total", "PostgreSQL rejected the filter as a WHERE clause"),
])
def test_malicious_additional_conditions_refused(settings, pg_conn, condition, reason) -> None:
    sig = parse_signal("evil", "execute-snapshot", {
        "data-collections": ["public.orders"],
        "additional-conditions": [{"data-collection": "public.orders", "filter": condition}]})
    with pytest.raises(ConfigurationError, match=reason):
        apply_signal(settings, sig)
    assert ProgressStore(settings.lakehouse, settings.slot).all() == []
    with pg_conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM orders")
        assert cur.fetchone()[0] == 200


def test_bad_payloads() -> None:
    with pytest.raises(SignalError, match="unknown type"):
        parse_signal("x", "explode", None)
    with pytest.raises(SignalError, match="only 'incremental'"):
        parse_signal("x", "execute-snapshot", '{"data-collections": ["a.b"], "type": "blocking"}')
    with pytest.raises(SignalError, match="not JSON"):
        parse_signal("x", "execute-snapshot", "{")

