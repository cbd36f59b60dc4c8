"""Asset checks and materialization metadata, through real jobs on PostgreSQL, Spark, Delta."""

from __future__ import annotations

import os

import dagster as dg
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pgcdc_dagster.capture.snapshot import load_contexts
from pgcdc_dagster.cdc.lsn import Lsn
from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.consistency import compare_tables
from pgcdc_dagster.ops.lsn_windows import (
    BronzeCommit,
    RunRange,
    WindowReport,
    check_commits,
    check_runs,
    last_snapshot,
)
from pgcdc_dagster.ops.schema_drift import normalise_type
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.ops.table_facts import read_facts
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

pytestmark = [pytest.mark.dagster, pytest.mark.integration, pytest.mark.spark]

TABLES = [("public", "items"), ("public", "tags")]
SETUP = """
CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8,2), seen timestamptz);
CREATE TABLE tags (item_id int, tag text, weight bigint, PRIMARY KEY (item_id, tag));
INSERT INTO items SELECT g, 'item ' || g, g * 0.5, now() FROM generate_series(1, 200) g;
INSERT INTO tags SELECT g, 't' || (g % 5), g FROM generate_series(1, 100) g;
"""
CHANGES = """
UPDATE items SET price = price + 1 WHERE id <= 50;
DELETE FROM items WHERE id > 190;
INSERT INTO items VALUES (1000, 'new', 9.99, now());
DELETE FROM tags WHERE item_id <= 10;
INSERT INTO tags VALUES (1000, 'fresh', -1);
"""


@pytest.fixture
def capture(pg_dsn, pg_conn, spark, lakehouse):
    """Tables created, definitions built, one instance shared by the test's runs."""
    with pg_conn.cursor() as cur:
        # Commits are flushed before they return, so a run started right after sees them.
        cur.execute("SET synchronous_commit = on")
        cur.execute(SETUP)
    definitions = build_definitions(TABLES, {
        "postgres": PostgresResource(dsn=pg_dsn),
        "lakehouse": LakehouseResource(root=str(lakehouse)),
        "capture": CaptureResource(tables="public\\..*", slot="dg_checks",
                                   publication="dg_checks"),
        "spark": SparkResource(),
    }, settings=MonitorSettings())
    with dg.instance_for_test() as instance:
        yield definitions, instance, str(lakehouse)


def run(definitions: dg.Definitions, instance: dg.DagsterInstance,
        job: str) -> dg.ExecuteInProcessResult:
    result = definitions.resolve_job_def(job).execute_in_process(instance=instance)
    assert result.success
    return result


def materializations(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    out = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization  # type: ignore[union-attr]
        out["/".join(mat.asset_key.path)] = {k: v.value for k, v in mat.metadata.items()}
    return out


def checks(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {f"{'/'.join(e.asset_key.path)}:{e.check_name}": e
            for e in result.get_asset_check_evaluations()}


def assert_passed(evaluations: dict[str, dg.AssetCheckEvaluation]) -> None:
    failed = {k: e.description for k, e in evaluations.items() if not e.passed}
    assert not failed, failed


def test_runs_carry_metadata_and_light_checks_pass(capture, pg_conn) -> None:
    definitions, instance, lakehouse = capture
    result = run(definitions, instance, "initial_snapshot")
    mats = materializations(result)
    items = mats["bronze/public/items"]
    # Reported as its snapshot commit was made (while other tables are read); the stream
    # that follows reports a table again only when it wrote to it (nothing here).
    assert items["capture_kind"] == "snapshot"
    assert items["events_r"] == 200 and items["events"] == 200
    assert items["rows_written"] == 200 and items["dagster/row_count"] == 200
    assert items["bytes_written"] > 0 and items["files_written"] >= 1
    assert "lsn_start" not in items and items["snapshot_lsn"] == items["snapshot_point"]
    assert len(result.get_asset_materialization_events()) == 4  # bronze and silver, 2 tables
    assert items["duration_s"] > 0 and items["rows_per_s"] > 0
    # version 0: the snapshot commit creates the table (two commits per table)
    assert items["delta_version"] == 0 and isinstance(items["slot_lag_bytes"], int)
    assert items["wal_status"] == "reserved"
    bronze_cols = {c.name for c in items["dagster/column_schema"].columns}
    assert {"key", "before", "after", "source", "op", "transaction"} <= bronze_cols
    silver = mats["silver/public/items"]
    assert silver["capture_kind"] == "snapshot"
    assert silver["dagster/row_count"] == 200 and silver["rows_written"] == 200
    assert silver["lsn_end"] == items["snapshot_lsn"]
    # silver as the snapshot commit created it, nothing left to catch up
    assert silver["delta_version"] == 0 and silver["events"] == 0
    assert silver["bronze_version_from"] == silver["bronze_version_to"] == 0
    columns = {c.name: c for c in silver["dagster/column_schema"].columns}
    assert columns["id"].constraints.other == ["primary key"]
    assert columns["id"].constraints.nullable is False
    assert columns["price"].type == "decimal128(8, 2)"
    assert "numeric" in columns["price"].description
    assert "__deleted" in columns
    evaluations = checks(result)
    assert set(evaluations) == {
        "bronze/public/items:lsn_windows_contiguous", "bronze/public/tags:lsn_windows_contiguous",
        "silver/public/items:schema_matches_source", "silver/public/tags:schema_matches_source",
        "source/replication_slot:slot_healthy"}
    assert_passed(evaluations)

    with pg_conn.cursor() as cur:
        cur.execute(CHANGES)
    result = run(definitions, instance, "cdc_microbatch")
    mats = materializations(result)
    items = mats["bronze/public/items"]
    assert items["capture_kind"] == "stream"
    assert (items["events_c"], items["events_u"], items["events_d"], items["events_r"]) == \
        (1, 50, 10, 0)
    assert items["rows_written"] == 61 and items["dagster/row_count"] == 261
    assert items["lsn_start"] != items["lsn_end"] and items["windows"] >= 1
    silver = mats["silver/public/items"]
    assert silver["capture_kind"] == "stream" and silver["events"] == 61
    assert silver["dagster/row_count"] == 191
    assert silver["lsn_end"] == items["lsn_end"]
    uri = table_uri(lakehouse, "silver", "public", "items")
    assert silver["dagster/uri"] == uri
    assert silver["delta_version"] == DeltaTable(uri).version()
    window = checks(result)["bronze/public/items:lsn_windows_contiguous"]
    assert window.passed and window.metadata["runs_checked"].value == 2
    assert window.metadata["covered_to"].value == items["lsn_end"]
    assert_passed(checks(result))


def test_silver_check_compares_at_the_silver_lsn_and_catches_tampering(capture, pg_conn,
                                                                       pg_dsn) -> None:
    definitions, instance, lakehouse = capture
    run(definitions, instance, "initial_snapshot")
    with pg_conn.cursor() as cur:
        cur.execute(CHANGES)
    run(definitions, instance, "cdc_microbatch")
    result = run(definitions, instance, "capture_checks")
    evaluations = checks(result)
    assert_passed(evaluations)
    ok = evaluations["silver/public/items:matches_source"]
    assert ok.metadata["compared"].value is True
    assert ok.metadata["source_rows"].value == ok.metadata["silver_rows"].value == 191
    assert ok.metadata["source_key_checksum"].value == ok.metadata["silver_key_checksum"].value

    # Changes the slot still holds: those keys are left out, the rest is compared exactly.
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE items SET name = 'pending' WHERE id IN (20, 21)")
        cur.execute("INSERT INTO items VALUES (2000, 'pending', 1, now())")
    evaluations = checks(run(definitions, instance, "capture_checks"))
    pending = evaluations["silver/public/items:matches_source"]
    assert pending.passed, pending.description
    assert pending.metadata["pending_events"].value == 3
    assert pending.metadata["excluded_keys"].value == 3
    assert pending.metadata["source_rows"].value == pending.metadata["silver_rows"].value == 189

    uri = table_uri(lakehouse, "silver", "public", "items")
    DeltaTable(uri).delete("id = 7")
    failed = checks(run(definitions, instance, "capture_checks"))
    deleted = failed["silver/public/items:matches_source"]
    assert not deleted.passed and deleted.severity == dg.AssetCheckSeverity.ERROR
    assert deleted.metadata["silver_rows"].value == deleted.metadata["source_rows"].value - 1
    assert deleted.metadata["missing_in_silver"].value == "(7,)"
    assert "rows: source 189, silver 188" in deleted.description
    assert failed["silver/public/tags:matches_source"].passed

    DeltaTable(uri).update(predicate="id = 8", updates={"name": "'tampered'"})
    modified = checks(run(definitions, instance, "capture_checks"))[
        "silver/public/items:matches_source"]
    assert not modified.passed
    assert modified.metadata["values_differ"].value == "(8,)"
    assert "row checksums differ" in modified.description

    # Something commits to items' silver after the sweep read the versions and before it
    # holds the slot: items is not compared (retry), tags still is.
    contexts = load_contexts(CaptureResource(tables="public\\..*", slot="dg_checks",
                                             publication="dg_checks").settings(pg_dsn,
                                                                               lakehouse))
    stale = [read_facts(c) for c in contexts]
    DeltaTable(uri).update(predicate="id = 9", updates={"name": "'later'"})
    reports = {r.table: r for r in compare_tables(pg_dsn, contexts, "dg_checks", "dg_checks",
                                                  facts=stale)}
    assert not reports["public.items"].compared
    assert "changed during the check" in reports["public.items"].reason
    assert reports["public.tags"].compared and reports["public.tags"].ok


def test_lsn_window_check_detects_wal_read_outside_the_pipeline(capture, pg_conn) -> None:
    definitions, instance, _ = capture
    run(definitions, instance, "initial_snapshot")
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE items SET name = 'lost' WHERE id = 1")
        # Someone consumes the slot by hand: this update never reaches bronze.
        cur.execute("SELECT pg_replication_slot_advance('dg_checks', pg_current_wal_flush_lsn())")
    result = run(definitions, instance, "capture_checks")
    gap = checks(result)["bronze/public/items:lsn_windows_contiguous"]
    assert not gap.passed
    assert "consumed outside the pipeline" in gap.description

    with pg_conn.cursor() as cur:
        cur.execute("UPDATE items SET name = 'kept' WHERE id = 2")
    result = run(definitions, instance, "cdc_microbatch")
    gap = checks(result)["bronze/public/items:lsn_windows_contiguous"]
    assert not gap.passed
    assert "was never read" in gap.description
    assert gap.metadata["runs_checked"].value == 2


def test_a_table_joining_after_an_incremental_snapshot_has_no_gap(capture, pg_conn,
                                                                  pg_dsn, lakehouse) -> None:
    """QA: an incremental-snapshot run records its WAL range on the bronze tables it wrote
    (the tables captured then). A table created afterwards joins the capture at the next
    micro-batch (snapshotted on a temporary slot): that run's range is no gap of its, and
    the check passes for it, while the tables captured all along keep the whole chain."""
    definitions, instance, _ = capture
    run(definitions, instance, "initial_snapshot")
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE items SET name = 'during' WHERE id <= 3")
    result = definitions.resolve_job_def("incremental_snapshot").execute_in_process(
        instance=instance, partition_key="public.tags")
    assert result.success
    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE late (id int PRIMARY KEY, v text); "
                    "INSERT INTO late SELECT g, 'v' FROM generate_series(1, 5) g")
    joined = build_definitions([*TABLES, ("public", "late")], definitions.resources,
                               settings=MonitorSettings())
    run(joined, instance, "cdc_microbatch")
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE late SET v = 'w' WHERE id = 1; UPDATE items SET name = 'after'")
    run(joined, instance, "cdc_microbatch")
    evaluations = checks(run(joined, instance, "capture_checks"))
    assert_passed(evaluations)
    late = evaluations["bronze/public/late:lsn_windows_contiguous"]
    assert late.metadata["runs_checked"].value == 3  # initial_snapshot, 2 micro-batches


def test_schema_drift_is_reported(capture, pg_conn) -> None:
    definitions, instance, _ = capture
    run(definitions, instance, "initial_snapshot")
    with pg_conn.cursor() as cur:
        cur.execute("ALTER TABLE items ADD COLUMN note text")
        cur.execute("ALTER TABLE tags ALTER COLUMN weight TYPE numeric(10,1)")
    evaluations = checks(run(definitions, instance, "capture_checks"))
    added = evaluations["silver/public/items:schema_matches_source"]
    assert not added.passed and added.severity == dg.AssetCheckSeverity.WARN
    assert added.metadata["added"].value == "note"
    changed = evaluations["silver/public/tags:schema_matches_source"]
    assert not changed.passed and changed.severity == dg.AssetCheckSeverity.ERROR
    assert changed.metadata["changed"].value == "weight: int64 -> decimal128(10, 1)"
    # Columns both sides have are still compared.
    assert evaluations["silver/public/items:matches_source"].passed

    # On demand (the UI's Execute on one check): the check definition runs alone.
    key = dg.AssetCheckKey(dg.AssetKey(["silver", "public", "items"]), "matches_source")
    alone = definitions.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection=set(), asset_check_selection={key}).execute_in_process(
        instance=instance)
    assert alone.success
    [one] = alone.get_asset_check_evaluations()
    assert (one.asset_key, one.check_name, one.passed) == (key.asset_key, key.name, True)
    assert one.metadata["compared"].value is True
    assert one.metadata["columns_not_compared"].value == "note"


def test_slot_health_check_fails_without_a_slot(capture) -> None:
    definitions, instance, _ = capture
    evaluations = checks(run(definitions, instance, "capture_checks"))
    slot = evaluations["source/replication_slot:slot_healthy"]
    assert not slot.passed and slot.severity == dg.AssetCheckSeverity.ERROR
    assert "does not exist" in slot.description
    silver = evaluations["silver/public/items:matches_source"]
    assert not silver.passed and silver.severity == dg.AssetCheckSeverity.WARN
    assert "initial_snapshot" in silver.description


def test_window_rules_on_recorded_histories() -> None:
    snap, w1, w2 = Lsn(0x100), Lsn(0x200), Lsn(0x300)

    def commits_report(commits, app):
        report = WindowReport("public.t")
        check_commits(report, commits, app)
        return report

    good = [BronzeCommit(1, "snapshot", snap), BronzeCommit(2, "stream", w1),
            BronzeCommit(3, "stream", w2, start=w1)]
    assert commits_report(good, int(w2)).ok
    twice = commits_report([*good, BronzeCommit(4, "stream", w2)], int(w2))
    assert "written twice or out of order" in twice.problems[0]
    overlap = commits_report([*good[:2], BronzeCommit(3, "stream", w2, start=Lsn(0x180))],
                             int(w2))
    assert "overlaps the previous one" in overlap.problems[0]
    # QA: the first window after a snapshot taken on a temporary slot (a table added later,
    # an interrupted initial snapshot resumed) starts at the slot, below the snapshot's point.
    assert commits_report([good[0], BronzeCommit(2, "stream", w1, start=Lsn(0x80)),
                           BronzeCommit(3, "stream", w2, start=w1)], int(w2)).ok
    stale = commits_report(good, int(w1))
    assert "app transaction records 0/200" in stale.problems[0]
    # A re-snapshot starts a new chain: windows may restart below the old ones.
    assert commits_report([*good, BronzeCommit(4, "snapshot", Lsn(0x400)),
                           BronzeCommit(5, "stream", Lsn(0x500))], 0x500).ok

    def runs_report(runs, slot):
        report = WindowReport("public.t")
        check_runs(report, runs, slot)
        return report

    chain = [RunRange("a", snap, snap, w1), RunRange("b", None, w1, w2)]
    assert runs_report(chain, w2).ok
    assert (runs_report(chain, w2).covered_from, runs_report(chain, w2).covered_to) == (snap, w2)
    back = runs_report([*chain, RunRange("c", None, w1, Lsn(0x400))], Lsn(0x400))
    assert "went backwards" in back.problems[0]
    behind = runs_report(chain, w1)
    assert "behind the last run's end" in behind.problems[0]
    resnap = [*chain, RunRange("c", Lsn(0x900), Lsn(0x900), Lsn(0xA00))]
    assert runs_report(resnap, Lsn(0xA00)).ok
    # QA: a table that joined the capture later (snapshotted on a temporary slot at 0x550)
    # has no range of the runs before it that wrote only the tables captured then (an
    # incremental snapshot covering (0x300, 0x400]): no gap of its. A gap after its
    # snapshot, or straddling it, is still one (named from the snapshot on).
    joined = [*chain, RunRange("inc-less", None, Lsn(0x400), Lsn(0x500)),
              RunRange("d", None, Lsn(0x500), Lsn(0x600))]
    assert "WAL (0/300, 0/400] was never read" in runs_report(joined, Lsn(0x600)).problems[0]
    report = WindowReport("public.t")
    check_runs(report, joined, Lsn(0x600),
               last_snapshot([BronzeCommit(7, "snapshot", Lsn(0x550)),
                              BronzeCommit(8, "stream", Lsn(0x600), start=Lsn(0x500))]))
    assert report.ok, report.problems
    report = WindowReport("public.t")
    check_runs(report, joined, Lsn(0x600), Lsn(0x350))
    assert report.problems == ["WAL (0/350, 0/400] was never read: run inc-less started at "
                               "0/400 but the previous run ended at 0/300 (the slot was "
                               "advanced outside the pipeline, or recreated without a "
                               "snapshot); changes in that range are missing from bronze: "
                               "re-snapshot the tables"]


def test_schema_types_fold_what_delta_does_not_keep() -> None:
    assert normalise_type(pa.large_string()) == normalise_type(pa.string_view()) == "string"
    assert normalise_type(pa.timestamp("us", "+00:00")) == normalise_type(pa.timestamp("ns", "UTC"))
    assert normalise_type(pa.timestamp("us")) != normalise_type(pa.timestamp("us", "UTC"))
    assert normalise_type(pa.large_list(pa.large_string())) == "list<string>"
    assert normalise_type(pa.decimal128(10, 2)) != normalise_type(pa.decimal128(10, 1))


def test_checks_name_the_fix_for_missing_privileges(capture, pg_conn, pg_dsn) -> None:
    """Checks run as a capture user short of privileges (a real role): no raw
    server error, the missing grant named (no REPLICATION: the ALTER ROLE; no SELECT: the
    table is left out, with its GRANT; USAGE on the schema revoked: PostgreSQL's refusal
    with the GRANT USAGE)."""
    definitions, instance, _ = capture
    run(definitions, instance, "initial_snapshot")
    role = "cdc_checker"
    with pg_conn.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} LOGIN; GRANT SELECT ON items TO {role}")
    try:
        dsn = " ".join([p for p in pg_dsn.split() if not p.startswith("user=")]
                       + [f"user={role}", "password='Zq9 x7Kw'"])
        as_role = build_definitions(TABLES, {**definitions.resources,
                                             "postgres": PostgresResource(dsn=dsn)},
                                    settings=MonitorSettings())

        def checks() -> dict[tuple[str, str], dg.AssetCheckEvaluation]:
            result = as_role.resolve_job_def("capture_checks").execute_in_process(
                instance=instance)
            assert result.success
            return {("/".join(e.asset_key.path), e.check_name): e
                    for e in result.get_asset_check_evaluations()}

        found = checks()  # the comparison reads the slot's pending changes: REPLICATION
        items = found[("silver/public/items", "matches_source")]
        assert not items.passed
        assert "ALTER ROLE <capture user> WITH REPLICATION" in str(items.description)
        with pg_conn.cursor() as cur:
            cur.execute(f"ALTER ROLE {role} WITH REPLICATION")
        found = checks()
        assert found[("silver/public/items", "matches_source")].passed
        tags = found[("silver/public/tags", "matches_source")]
        assert not tags.passed and "no SELECT privilege" in str(tags.description)
        assert "GRANT SELECT ON public.tags TO <capture user>" in str(tags.description)

        with pg_conn.cursor() as cur:
            cur.execute(f"REVOKE USAGE ON SCHEMA public FROM PUBLIC, {role}")
        found = checks()
        items = found[("silver/public/items", "matches_source")]
        assert not items.passed
        assert "GRANT USAGE ON SCHEMA <schema> TO <capture user>" in str(items.description)
        for evaluation in found.values():
            text = str(evaluation.description)
            assert "Zq9" not in text and "x7Kw" not in text
            if "permission denied" in text:
                assert "Fix:" in text, text
    finally:
        with pg_conn.cursor() as cur:
            cur.execute(f"GRANT USAGE ON SCHEMA public TO PUBLIC; DROP OWNED BY {role}; "
                        f"DROP ROLE {role}")


def test_a_run_failing_after_the_slot_moved_leaves_no_gap(capture, pg_conn) -> None:
    """QA: a micro-batch that failed (or was killed) after its bronze commit and slot advance,
    before its last events, recorded no LSN range: lsn_windows_contiguous then failed for
    every table the run did not change ("WAL ... was never read"), for good."""
    definitions, instance, lakehouse = capture
    run(definitions, instance, "initial_snapshot")
    with pg_conn.cursor() as cur:
        cur.execute("UPDATE items SET price = price + 1 WHERE id <= 5")
    # Silver of items cannot be opened: the run commits bronze, moves the slot, then fails.
    log = f"{lakehouse}/silver/public/items/_delta_log"
    version = DeltaTable(table_uri(lakehouse, "silver", "public", "items")).version()
    garbage = f"{log}/{version + 1:020d}.json"
    with open(garbage, "w") as f:
        f.write("not a delta commit\n")
    failed = definitions.resolve_job_def("cdc_microbatch").execute_in_process(
        instance=instance, raise_on_error=False)
    assert not failed.success
    os.remove(garbage)
    run(definitions, instance, "cdc_microbatch")  # silver catches up
    evaluations = checks(run(definitions, instance, "capture_checks"))
    tags = evaluations["bronze/public/tags:lsn_windows_contiguous"]
    assert tags.passed, tags.description
    assert_passed(evaluations)
