"""A user's own project with two sources, built the documented ways (the factory, and the
Component through ``dg``): two databases, two slots, one code location, one instance.

Each capture's names are its own (resource keys, jobs, pool, partitions, slot-level keys),
table keys are prefixed through the translator, a user asset depends on a silver table, both
captures snapshot and stream, silver equals each source, and a failing slot check of one
capture stays failing when the other's passes. A source that does not answer fails runs,
never the loading of the definitions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from pgcdc_dagster import PgcdcTranslator, pgcdc_definitions
from pgcdc_dagster.lake.paths import table_uri
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.postgres.local_cluster import free_port
from pgcdc_dagster.resources import CaptureResource, LakehouseResource, PostgresResource
from tests.support.compare import assert_silver_equals_source

pytestmark = [pytest.mark.dagster, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
SETUP = ("CREATE TABLE orders (id int PRIMARY KEY, amount int NOT NULL, note text); "
         "INSERT INTO orders SELECT g, g * {k}, 'n' || g FROM generate_series(1, 40) g")
CHANGES = ("INSERT INTO orders VALUES (100, 1, 'new'); "
           "UPDATE orders SET amount = amount + {k} WHERE id <= 10; "
           "DELETE FROM orders WHERE id BETWEEN 30 AND 34")
APP_SILVER = dg.AssetKey(["lake", "app", "silver", "public", "orders"])
BILLING_SILVER = dg.AssetKey(["billing", "silver", "public", "orders"])


def _run(conn_dsn: str, statement: str) -> None:
    import psycopg2

    conn = psycopg2.connect(conn_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()


def _user_project(lake: Path) -> dg.Definitions:
    """The README's multi-source project: two factories and an asset of the user's own."""
    app = pgcdc_definitions(
        name="app", postgres=PostgresResource(dsn=dg.EnvVar("APP_PG_DSN")),
        lakehouse=LakehouseResource(root=str(lake / "app")),
        capture=CaptureResource(slot="app_cdc", publication="app_cdc", topic_prefix="app"),
        tables=["public.orders"], translator=PgcdcTranslator(key_prefix=["lake", "app"]),
        settings=MonitorSettings())
    billing = pgcdc_definitions(  # the default translator prefixes the keys with the name
        name="billing", postgres=PostgresResource(dsn=dg.EnvVar("BILLING_PG_DSN")),
        lakehouse=LakehouseResource(root=str(lake / "billing")),
        capture=CaptureResource(slot="billing_cdc", publication="billing_cdc",
                                topic_prefix="billing"),
        tables=["public.orders"], settings=MonitorSettings())

    @dg.asset(deps=[APP_SILVER])
    def order_report() -> None:
        """The user's own asset, downstream of a silver table."""

    return dg.Definitions.merge(app, billing, dg.Definitions(assets=[order_report]))


def _snapshot_and_stream(defs: dg.Definitions, instance: dg.DagsterInstance,
                         sources: dict[str, str], lake: Path) -> None:
    """Both captures snapshot, then stream changes; silver equals each source."""
    import psycopg2

    for k, (name, dsn) in enumerate(sources.items(), start=2):
        _run(dsn, SETUP.format(k=k))
        result = defs.resolve_job_def(f"{name}_initial_snapshot").execute_in_process(
            instance=instance)
        assert result.success
    for k, (name, dsn) in enumerate(sources.items(), start=2):
        _run(dsn, CHANGES.format(k=k))
        result = defs.resolve_job_def(f"{name}_cdc_microbatch").execute_in_process(
            instance=instance)
        assert result.success
        # each run reports its own capture's keys only
        keys = {e.asset_key for e in result.get_asset_materialization_events()}
        other = next(n for n in sources if n != name)
        assert keys and not any(other in k.path[:2] for k in keys), keys
    for name, dsn in sources.items():
        conn = psycopg2.connect(dsn)
        try:
            uri = table_uri(str(lake / name), "silver", "public", "orders")
            assert assert_silver_equals_source(conn, uri, "public", "orders", ["id"]) == 36
        finally:
            conn.close()


def test_two_sources_through_the_factory(pg_dsn, second_pg_dsn, tmp_path, monkeypatch
                                         ) -> None:
    monkeypatch.setenv("APP_PG_DSN", pg_dsn)
    monkeypatch.setenv("BILLING_PG_DSN", second_pg_dsn)
    lake = tmp_path / "lake"
    defs = _user_project(lake)
    graph = defs.resolve_asset_graph()
    assert APP_SILVER in graph.get(dg.AssetKey("order_report")).parent_keys
    assert {APP_SILVER, BILLING_SILVER, dg.AssetKey(["app", "source", "replication_slot"]),
            dg.AssetKey(["billing", "source", "replication_slot"])} <= graph.get_all_asset_keys()
    assert {"app_initial_snapshot", "billing_cdc_microbatch", "app_capture_checks",
            "billing_teardown"} <= {job.name for job in defs.resolve_all_job_defs()}
    pools = {node.pool for job in defs.resolve_all_job_defs() for node in job.graph.node_defs
             if getattr(node, "pool", None)}
    assert {"app_pgcdc_slot", "billing_pgcdc_slot"} <= pools

    with dg.instance_for_test() as instance:
        _snapshot_and_stream(defs, instance, {"app": pg_dsn, "billing": second_pg_dsn}, lake)
        # billing's slot is lost; its check fails, and app's passing check does not hide it
        _run(second_pg_dsn, "SELECT pg_drop_replication_slot('billing_cdc')")
        defs.resolve_job_def("billing_capture_checks").execute_in_process(
            instance=instance, raise_on_error=False)
        assert defs.resolve_job_def("app_cdc_microbatch").execute_in_process(
            instance=instance).success
        app_check = dg.AssetCheckKey(dg.AssetKey(["app", "source", "replication_slot"]),
                                     "slot_healthy")
        billing_check = dg.AssetCheckKey(dg.AssetKey(["billing", "source", "replication_slot"]),
                                         "slot_healthy")
        app_record = instance.get_latest_asset_check_evaluation_record(app_check)
        billing_record = instance.get_latest_asset_check_evaluation_record(billing_check)
        assert app_record is not None and billing_record is not None
        assert app_record.evaluation is not None and app_record.evaluation.passed
        assert billing_record.evaluation is not None and not billing_record.evaluation.passed
        assert set(instance.get_dynamic_partitions("app_pgcdc_incremental_tables")) == \
            set(instance.get_dynamic_partitions("billing_pgcdc_incremental_tables")) == \
            {"public.orders"}


def test_two_sources_through_the_component(pg_dsn, second_pg_dsn, tmp_path, monkeypatch
                                           ) -> None:
    """``dg scaffold defs``, two defs.yaml edited; the project's definitions (its defs
    folder, as ``dg dev`` loads it) capture both sources into one instance."""
    project = tmp_path / "userproj"
    (project / "src" / "userproj" / "defs").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "userproj"\nversion = "0.1"\n\n[tool.dg]\n'
        'directory_type = "project"\n\n[tool.dg.project]\nroot_module = "userproj"\n'
        'registry_modules = ["pgcdc_dagster"]\n')
    (project / "src" / "userproj" / "__init__.py").write_text("")
    (project / "src" / "userproj" / "defs" / "__init__.py").write_text("")
    (project / "src" / "userproj" / "definitions.py").write_text(
        "from pathlib import Path\n\nimport dagster as dg\n\n\n@dg.definitions\n"
        "def defs() -> dg.Definitions:\n    return dg.load_from_defs_folder("
        "path_within_project=Path(__file__).parent)\n")
    (project / "src" / "userproj" / "defs" / "reports.py").write_text(
        "import dagster as dg\n\n\n@dg.asset(deps=[dg.AssetKey(['app', 'silver', 'public', "
        "'orders'])])\ndef order_report() -> None:\n    pass\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{project / 'src'}",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "DAGSTER_HOME": str(tmp_path), "APP_PG_DSN": pg_dsn,
           "BILLING_PG_DSN": second_pg_dsn}
    scaffold = subprocess.run(["dg", "scaffold", "defs", "pgcdc_dagster.PgcdcComponent",
                               "app_capture"], cwd=project, env=env, capture_output=True,
                              text=True, timeout=300)
    assert scaffold.returncode == 0, scaffold.stdout[-2000:] + scaffold.stderr[-2000:]
    defs_dir = project / "src" / "userproj" / "defs"
    assert "dsn_env: APP_PG_DSN" in (defs_dir / "app_capture" / "defs.yaml").read_text()
    (defs_dir / "billing_capture").mkdir()  # a second one, as a copy of the first
    for name in ("app", "billing"):
        yaml = defs_dir / f"{name}_capture" / "defs.yaml"
        yaml.write_text(
            "type: pgcdc_dagster.PgcdcComponent\n\nattributes:\n"
            f"  name: {name}\n  dsn_env: {name.upper()}_PG_DSN\n"
            "  tables: [public.orders]\n"
            f"  slot: {name}_cdc\n  lakehouse: lake/{name}\n  key_prefix: [{name}]\n")
    # (`dg check defs` validates the same files as the load below does; a dg process costs
    # tens of seconds on a loaded machine, so the test runs one)

    monkeypatch.setenv("APP_PG_DSN", pg_dsn)
    monkeypatch.setenv("BILLING_PG_DSN", second_pg_dsn)
    monkeypatch.syspath_prepend(str(project / "src"))
    import userproj.defs  # type: ignore[import-not-found]

    defs = dg.load_from_defs_folder(path_within_project=Path(userproj.defs.__file__).parent)
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey(["app", "silver", "public", "orders"]) in \
        graph.get(dg.AssetKey("order_report")).parent_keys
    with dg.instance_for_test() as instance:
        _snapshot_and_stream(defs, instance, {"app": pg_dsn, "billing": second_pg_dsn},
                             project / "lake")


def test_loads_with_the_source_stopped_and_runs_fail_naming_it(tmp_path, monkeypatch) -> None:
    """Nothing listens at the source's address: the definitions load (explicit tables need no
    source), and the capture run fails naming the source, without its password."""
    port = free_port()
    monkeypatch.setenv("APP_PG_DSN", f"host=127.0.0.1 port={port} dbname=app user=cdc "
                                     "password=topsecret connect_timeout=5")
    defs = pgcdc_definitions(
        name="app", postgres=PostgresResource(dsn=dg.EnvVar("APP_PG_DSN")),
        lakehouse=LakehouseResource(root=str(tmp_path / "lake")),
        capture=CaptureResource(slot="app_cdc"), tables=["public.orders"],
        settings=MonitorSettings())
    assert dg.AssetKey(["app", "silver", "public", "orders"]) in \
        defs.resolve_asset_graph().get_all_asset_keys()
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("app_initial_snapshot").execute_in_process(
            instance=instance, raise_on_error=False)
    assert not result.success
    failure = " ".join(str(e.event_specific_data.error)  # type: ignore[union-attr]
                       for e in result.all_events if e.is_step_failure)
    assert f"port={port}" in failure and "cannot connect to the source" in failure, failure
    assert "topsecret" not in failure


class _SalesTranslator(PgcdcTranslator):
    """A user's translator: its own keys, group, owners and tags."""

    def get_asset_spec(self, props):  # type: ignore[no-untyped-def]
        spec = super().get_asset_spec(props)
        return spec.replace_attributes(
            key=dg.AssetKey(["warehouse", props.layer, props.table]), group_name="sales",
            owners=["team:sales"], tags={**spec.tags, "domain": "sales"})


def test_a_translator_chooses_keys_groups_owners_and_tags() -> None:
    """Specs are the translator's; what selects or reports assets goes by those keys."""
    defs = pgcdc_definitions(
        name="sales", postgres=PostgresResource(dsn="host=unused"),
        lakehouse=LakehouseResource(root="/unused"), capture=CaptureResource(slot="sales"),
        tables=["public.orders", "public.lines"], translator=_SalesTranslator(),
        settings=MonitorSettings())
    graph = defs.resolve_asset_graph()
    silver = graph.get(dg.AssetKey(["warehouse", "silver", "orders"]))
    assert silver.group_name == "sales" and silver.owners == ["team:sales"]
    assert silver.tags["domain"] == "sales"
    assert silver.metadata["dagster/table_name"] == "silver.public.orders"
    assert dg.AssetKey(["warehouse", "bronze", "orders"]) in silver.parent_keys
    checks = {k.asset_key for k in graph.asset_check_keys}
    assert dg.AssetKey(["warehouse", "silver", "lines"]) in checks
    assert dg.AssetKey(["sales", "source", "replication_slot"]) in checks


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "bad-name"}, "capture name 'bad-name' is not a valid name"),
    ({"capture": CaptureResource(snapshot_mode="intial")}, "capture 'app': snapshot.mode"),
    ({"tables": ["a.b.c"]}, "tables: "),
])
def test_settings_are_checked_when_the_definitions_are_built(kwargs, message) -> None:
    from pgcdc_dagster.exceptions import ConfigurationError

    arguments = {"name": "app", "postgres": PostgresResource(dsn="host=unused"),
                 "lakehouse": LakehouseResource(root="/unused"),
                 "capture": CaptureResource(slot="app"), "tables": ["public.orders"],
                 "settings": MonitorSettings(), **kwargs}
    with pytest.raises(ConfigurationError, match=message):
        pgcdc_definitions(**arguments)  # type: ignore[arg-type]
