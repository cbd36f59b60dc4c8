"""Hostile ``additional-conditions`` through both documented channels.

Real PostgreSQL, Spark, Delta and Dagster: the ``incremental_snapshot`` job (run config
``additional_condition``), the ``incremental_snapshot_signal`` job, and the signalling table
with ``signal_table_sensor``. A sentinel backend, another consumer's replication slot and
traps in a user schema (operators that terminate the backend, drop the slot and write a
table) are armed. Every hostile filter is refused naming the problem, before anything is
read; no Delta table of the lakehouse (bronze, silver, internal) and no progress entry
changes; the sentinels survive; legitimate filters (through each channel) select the right
rows, and silver of both tables still equals the source.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.incremental_state import ProgressStore
from pgcdc_dagster.postgres.signals import create_signal_table
from tests.dagster import test_incremental_job
from tests.dagster.test_incremental_job import (
    _check_silver,
    _incremental_rows,
    _partition_mats,
    _tick,
)
from tests.integration.test_sql_filter_pg import TRAP, Sentinels

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

capture = test_incremental_job.capture  # the fixture: initial snapshot of items and tags

TRAPS = TRAP + """
CREATE OPERATOR public.= (LEFTARG = int4, RIGHTARG = numeric, FUNCTION = evil.trap);
CREATE OPERATOR public.>= (LEFTARG = int4, RIGHTARG = numeric, FUNCTION = evil.trap);
CREATE OPERATOR public.=== (LEFTARG = int4, RIGHTARG = numeric, FUNCTION = evil.trap);
"""


def _hostile(pid: int, slot: str) -> list[tuple[str, str]]:
    """(filter, what the refusal names): each class in several spellings."""
    return [
        (f'U&"pg_terminate_backend"({pid}) IS NULL', "function pg_terminate_backend"),
        (f'U&"\\0070g_terminate_backend"({pid}) IS NULL', "function pg_terminate_backend"),
        (f'U&"!0070g_drop_replication_slot" UESCAPE \'!\'(\'{slot}\') IS NULL',
         "function pg_drop_replication_slot"),
        (f"name = '\\' OR pg_terminate_backend({pid}) OR name = '\\'",
         "function pg_terminate_backend"),
        (f"name = E'\\'' OR \"pg_catalog\".\"pg_drop_replication_slot\"('{slot}') IS NULL",
         "function pg_catalog.pg_drop_replication_slot"),
        (f"name = $q$'$q$ OR PG_TERMINATE_BACKEND({pid})", "function pg_terminate_backend"),
        ("id > 0 /* ; */ OR pg_sleep(30) IS NULL", "function pg_sleep"),
        (f"id > 0; SELECT pg_drop_replication_slot('{slot}')", "';' is not allowed"),
        (f"id IN (SELECT pg_terminate_backend({pid}))", "a sub-query is not allowed"),
        ("id IN (SELECT generate_series(1, 3))", "a sub-query is not allowed"),
        ("generate_series(1, 3) > id", "function generate_series"),
        (f"'{slot}'::regclass IS NULL", "a cast to regclass"),
        ("'pg_terminate_backend'::regproc IS NULL", "a cast to regproc"),
        ("id OPERATOR(public.=) 5.0", "operator OPERATOR(public.=)"),
        ("id === 5.0", "operator ==="),
        ("evil.trap(id, 1)", "function evil.trap"),
        ("set_config('default_transaction_read_only', 'off', false) = 'off'",
         "function set_config"),
    ]


def _delta_versions(lakehouse: str) -> dict[str, int]:
    """Every Delta table under the lakehouse root (bronze, silver, _pgcdc) and its version."""
    return {str(log.parent.relative_to(lakehouse)): DeltaTable(str(log.parent)).version()
            for log in Path(lakehouse).rglob("_delta_log")}


def _failure(result: dg.ExecuteInProcessResult) -> str:
    return " ".join(str(e.event_specific_data.error)  # type: ignore[union-attr]
                    for e in result.all_events if e.is_step_failure)


def test_hostile_filters_through_both_channels(capture, pg_conn, pg_dsn) -> None:
    definitions, instance, lakehouse = capture
    with pg_conn.cursor() as cur:
        cur.execute(TRAPS)
    sentinels = Sentinels(pg_dsn, pg_conn, tables=("items", "tags"))
    sentinels.arm()
    store = ProgressStore(*_store_args(definitions, lakehouse))
    hostile = _hostile(sentinels.pid, sentinels.slot)
    versions = _delta_versions(lakehouse)
    assert any(k.startswith("bronze/_pgcdc") for k in versions)  # internal tables too
    try:
        # 1. The Dagster job: run config additional_condition.
        job = definitions.resolve_job_def("incremental_snapshot")
        for text, reason in hostile:
            result = job.execute_in_process(
                instance=instance, partition_key="public.items", raise_on_error=False,
                run_config={"ops": {"incremental__snapshot": {"config": {
                    "additional_condition": text}}}})
            assert not result.success, text
            message = _failure(result)
            assert "additional-conditions for public.items" in message and reason in message, \
                (text, message)
        # 2. The Dagster signal job (same payload as the signalling table).
        signal_job = definitions.resolve_job_def("incremental_snapshot_signal")
        for text, reason in hostile[::4]:
            result = signal_job.execute_in_process(
                instance=instance, raise_on_error=False, run_config={"ops": {
                    "apply_incremental_signal": {"config": {
                        "type": "execute-snapshot", "data": _payload("public.items", text)}}}})
            assert not result.success and reason in _failure(result), text
        # 3. The signalling table and its sensor: every row refused, none fatal.
        create_signal_table(pg_conn, "public.dbz_signal")
        with pg_conn.cursor() as cur:
            for n, (text, _reason) in enumerate(hostile):
                cur.execute("INSERT INTO dbz_signal VALUES (%s, 'execute-snapshot', %s)",
                            (f"evil-{n}", _payload("public.items", text)))
        tick = _tick(definitions, instance, None)
        assert not tick.run_requests
        skipped = str(tick.skip_reason.skip_message if tick.skip_reason else "")
        for n, (text, reason) in enumerate(hostile):
            assert f"signal 'evil-{n}' (execute-snapshot) refused: additional-conditions " \
                "for public.items" in skipped, text
            assert reason in skipped, (text, reason)
        sentinels.assert_untouched()
        assert store.all() == []  # no snapshot was requested
        assert _delta_versions(lakehouse) == versions  # nothing was written anywhere

        # 4. Legitimate filters still work through each channel, even where a trap would be
        # reached by the raw text (int = numeric, int >= numeric resolve to evil.trap).
        legit = "id = 150.0 OR id BETWEEN 10.0 AND 12 OR price IN (50.0) OR name LIKE 'item 3'"
        with pg_conn.cursor() as cur:
            cur.execute("INSERT INTO dbz_signal VALUES ('legit', 'execute-snapshot', %s)",
                        (_payload("public.items", legit),))
        second = _tick(definitions, instance, tick.cursor)
        [request] = second.run_requests
        run = job.execute_in_process(instance=instance, partition_key=request.partition_key,
                                     tags=request.tags)
        assert run.success
        assert sorted(r["id"] for r in _incremental_rows(lakehouse, "items")) == \
            [3, 10, 11, 12, 100, 150]
        tags_filter = ('"tag" IN (\'t1\', \'t2\') AND weight BETWEEN 10 AND 40 '
                       "AND coalesce(item_id, 0) = item_id AND CAST(weight AS text) NOT LIKE '3%'")
        run = job.execute_in_process(
            instance=instance, partition_key="public.tags", run_config={"ops": {
                "incremental__snapshot": {"config": {"additional_condition": tags_filter}}}})
        assert run.success
        with pg_conn.cursor() as cur:
            cur.execute(f"SELECT item_id FROM tags WHERE {tags_filter} ORDER BY 1")
            expected = [r[0] for r in cur.fetchall()]
        assert expected and sorted(r["item_id"] for r in _incremental_rows(lakehouse, "tags")) \
            == expected
        mats = _partition_mats(instance)
        assert mats["public.tags"]["additional_condition"].startswith(
            '((("tag" OPERATOR(pg_catalog.=) E\'t1\')')
        sentinels.assert_untouched()
        _check_silver(pg_conn, lakehouse)  # every table still converges
    finally:
        sentinels.backend.close()


def _payload(table: str, text: str) -> str:
    return json.dumps({"data-collections": [table], "additional-conditions": [
        {"data-collection": table, "filter": text}]})


def _store_args(definitions: dg.Definitions, lakehouse: str) -> tuple[str, str]:
    settings = definitions.resources["capture"].settings(  # type: ignore[attr-defined]
        definitions.resources["postgres"].dsn, lakehouse)  # type: ignore[attr-defined]
    return settings.lakehouse, settings.slot
