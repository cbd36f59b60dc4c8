"""``table.exclude.list`` in the initial snapshot and in the stream after it.

CFG-34 (``table.blacklist``, now ``table.exclude.list``: regular expressions of the tables to
leave out), CFG-33/35 (``table.include.list``), SNAP-03/05 (a consistent snapshot, then the
stream from its point), STR-29 (a publication FOR ALL TABLES: the connector filters the
tables itself).

Three tables, one of them excluded: the snapshot reads exactly the other two (their bronze
``op = r`` events and silver equal the source), the excluded one gets no bronze or silver
table at all, and the stream after the snapshot delivers the other two tables' changes and
none of the excluded one's, both when the publication holds only the captured tables
(``filtered``: PostgreSQL never decodes the excluded table) and when it holds every table
(``all_tables``: the slot does carry the excluded table's changes, which the capture must
drop).

Both lists at once: Debezium's documentation says the exclude list is "not with"
the include list (CFG-33/34). This project accepts both and applies them in turn
(``postgres.discovery.resolve_tables``: the include list selects, then the exclude list
removes, so an excluded table stays out even when an include pattern names it). The second
test pins that behaviour down.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg2
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.runner import run_bronze, run_silver
from pgcdc_dagster.capture.settings import CaptureSettings
from pgcdc_dagster.capture.snapshot import load_contexts, run_snapshot
from pgcdc_dagster.lake.delta import open_table
from pgcdc_dagster.lake.paths import table_uri
from tests.support.compare import assert_silver_equals_source, source_rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = r"""
CREATE TABLE alpha (id int PRIMARY KEY, v text, n numeric(10,2));
CREATE TABLE beta (k text, b int, v text, PRIMARY KEY (k, b));
CREATE TABLE secret (id int PRIMARY KEY, v text);
INSERT INTO alpha SELECT g, 'a' || g, g * 0.25 FROM generate_series(1, 3000) g;
INSERT INTO beta SELECT 'k' || (g % 13), g, 'b' || g FROM generate_series(1, 2000) g;
INSERT INTO secret SELECT g, 's' || g FROM generate_series(1, 1500) g;
"""
KEYS = {"alpha": ["id"], "beta": ["k", "b"], "secret": ["id"]}

# Changes after the snapshot: per table, the op counts the stream must deliver.
CHANGES = r"""
UPDATE alpha SET v = v || '+' WHERE id <= 40;
DELETE FROM alpha WHERE id > 2990;
INSERT INTO alpha VALUES (5001, 'new', 1.5), (5002, 'new', 2.5);
UPDATE beta SET v = 'changed' WHERE b <= 25;
DELETE FROM beta WHERE b > 1995;
INSERT INTO beta VALUES ('z', 9001, 'late');
UPDATE secret SET v = 'hidden' WHERE id <= 100;
DELETE FROM secret WHERE id > 1400;
INSERT INTO secret VALUES (9001, 'hidden');
"""
EXPECTED_OPS = {"alpha": {"u": 40, "d": 10, "c": 2}, "beta": {"u": 25, "d": 5, "c": 1}}


def _settings(dsn: str, lakehouse: Path, **kw: object) -> CaptureSettings:
    base: dict[str, object] = dict(dsn=dsn, lakehouse=str(lakehouse), slot="excl",
                                   publication="excl", snapshot_chunk_bytes=64 << 10,
                                   window_max_bytes=8 << 20)
    base.update(kw)
    return CaptureSettings(**base)  # type: ignore[arg-type]


def _uri(lakehouse: Path, layer: str, table: str) -> str:
    return table_uri(str(lakehouse), layer, "public", table)


def _ops(lakehouse: Path, table: str) -> dict[str, int]:
    data = DeltaTable(_uri(lakehouse, "bronze", table)).to_pyarrow_table(columns=["op"])
    return {c["values"]: c["counts"] for c in pc.value_counts(data["op"]).to_pylist()}


def _bronze_snapshot_keys(lakehouse: Path, table: str) -> list[tuple]:
    data = DeltaTable(_uri(lakehouse, "bronze", table)).to_pyarrow_table(columns=["key", "op"])
    keys = data.filter(pc.equal(data["op"], "r"))["key"].to_pylist()
    return [tuple(k[c] for c in KEYS[table]) for k in keys]


def _check_captured(pg_conn, lakehouse: Path, tables: list[str]) -> None:
    """Silver equals the source, and bronze holds one ``r`` event per snapshotted row."""
    for table in tables:
        assert_silver_equals_source(pg_conn, _uri(lakehouse, "silver", table), "public",
                                    table, KEYS[table])


def _check_absent(lakehouse: Path, tables: list[str]) -> None:
    """No bronze or silver table, not even an empty directory, for a table not captured."""
    for table in tables:
        for layer in ("bronze", "silver"):
            uri = _uri(lakehouse, layer, table)
            assert open_table(uri) is None, f"{layer} table of excluded {table} exists"
            assert not os.path.exists(uri), f"{uri} was created for excluded {table}"


def _published(pg_conn, publication: str) -> tuple[bool, set[str]]:
    with pg_conn.cursor() as cur:
        cur.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s",
                    (publication,))
        all_tables = bool(cur.fetchone()[0])
        cur.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = %s",
                    (publication,))
        return all_tables, {str(r[0]) for r in cur.fetchall()}


def _decoded_relations(pg_conn, slot: str, publication: str, table: str) -> int:
    """pgoutput Relation messages for ``public.<table>`` waiting in the slot (a peek)."""
    with pg_conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', %s) "
            "WHERE get_byte(data, 0) = 82 AND position(%s IN data) > 0",
            (slot, publication, psycopg2.Binary(f"public\0{table}\0".encode())))
        return int(cur.fetchone()[0])


@pytest.mark.parametrize("publication_mode", ["filtered", "all_tables"])
def test_excluded_table_is_neither_snapshotted_nor_streamed(publication_mode, pg_dsn, pg_conn,
                                                            spark, lakehouse) -> None:
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    settings = _settings(pg_dsn, lakehouse, exclude=(r"public\.secret",),
                         publication_autocreate=publication_mode)
    assert sorted(c.name for c in load_contexts(settings)) == ["public.alpha", "public.beta"]
    # The control: without the exclude list the same database captures all three tables.
    everything = load_contexts(_settings(pg_dsn, lakehouse))
    assert sorted(c.name for c in everything) == ["public.alpha", "public.beta",
                                                   "public.secret"]

    report = run_snapshot(settings, spark, force=True)
    assert report.performed and report.slot_action == "create"
    assert {t.table: t.rows for t in report.tables} == {"public.alpha": 3000,
                                                        "public.beta": 2000}
    assert report.empty_tables == []
    _check_captured(pg_conn, lakehouse, ["alpha", "beta"])
    for table in ("alpha", "beta"):
        keys = _bronze_snapshot_keys(lakehouse, table)
        assert len(keys) == len(set(keys))
        assert set(keys) == set(source_rows(pg_conn, "public", table, KEYS[table]))
    _check_absent(lakehouse, ["secret"])
    all_tables, published = _published(pg_conn, settings.publication)
    if publication_mode == "filtered":
        assert not all_tables and published == {"alpha", "beta"}
    else:
        assert all_tables and "secret" in published

    with pg_conn.cursor() as cur:
        cur.execute(CHANGES)
    # With a FOR ALL TABLES publication the slot does decode the excluded table's changes:
    # the stream below must drop them. The filtered publication keeps them out of the slot.
    secret_in_slot = _decoded_relations(pg_conn, settings.slot, settings.publication, "secret")
    assert (secret_in_slot > 0) == (publication_mode == "all_tables")
    assert _decoded_relations(pg_conn, settings.slot, settings.publication, "alpha") > 0

    run = run_bronze(settings, spark, force_snapshot_step=False)
    assert run.snapshot is not None and not run.snapshot.performed
    assert run.stream is not None and run.stream.windows
    streamed = {t: ops for t, ops in run.stream.events_by_table().items()
                if not t.startswith("_pgcdc.")}
    assert streamed == {f"public.{t}": ops for t, ops in EXPECTED_OPS.items()}
    run_silver(settings, spark)
    snapshot_rows = {"alpha": 3000, "beta": 2000}
    for table, ops in EXPECTED_OPS.items():
        assert _ops(lakehouse, table) == {"r": snapshot_rows[table], **ops}
    _check_captured(pg_conn, lakehouse, ["alpha", "beta"])
    _check_absent(lakehouse, ["secret"])
    # Everything the slot held was read: the excluded table's changes were dropped, not
    # left behind for a later run.
    with pg_conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                    "'proto_version', '1', 'publication_names', %s) "
                    "WHERE get_byte(data, 0) IN (73, 85, 68)",  # I, U, D
                    (settings.slot, settings.publication))
        assert cur.fetchone()[0] == 0


def test_include_and_exclude_lists_apply_in_turn(pg_dsn, pg_conn, spark, lakehouse) -> None:
    """The include list names alpha and secret, the exclude list secret: alpha alone is
    captured (beta is not included, secret is excluded although an include pattern names it)."""
    with pg_conn.cursor() as cur:
        cur.execute(SCHEMA)
    settings = _settings(pg_dsn, lakehouse, include=(r"public\.alpha", r"public\.secret"),
                         exclude=(r"public\.secret",))
    assert [c.name for c in load_contexts(settings)] == ["public.alpha"]
    # Each list alone selects more: the combination is not one of them ignored.
    only_include = _settings(pg_dsn, lakehouse, include=settings.include)
    assert sorted(c.name for c in load_contexts(only_include)) == ["public.alpha",
                                                                   "public.secret"]
    only_exclude = _settings(pg_dsn, lakehouse, exclude=settings.exclude)
    assert sorted(c.name for c in load_contexts(only_exclude)) == ["public.alpha",
                                                                   "public.beta"]

    report = run_snapshot(settings, spark, force=True)
    assert report.performed
    assert {t.table: t.rows for t in report.tables} == {"public.alpha": 3000}
    _check_captured(pg_conn, lakehouse, ["alpha"])
    _check_absent(lakehouse, ["beta", "secret"])
    assert _published(pg_conn, settings.publication) == (False, {"alpha"})

    with pg_conn.cursor() as cur:
        cur.execute(CHANGES)
    run = run_bronze(settings, spark, force_snapshot_step=False)
    assert run.stream is not None
    streamed = {t: ops for t, ops in run.stream.events_by_table().items()
                if not t.startswith("_pgcdc.")}
    assert streamed == {"public.alpha": EXPECTED_OPS["alpha"]}
    run_silver(settings, spark)
    assert _ops(lakehouse, "alpha") == {"r": 3000, **EXPECTED_OPS["alpha"]}
    _check_captured(pg_conn, lakehouse, ["alpha"])
    _check_absent(lakehouse, ["beta", "secret"])
