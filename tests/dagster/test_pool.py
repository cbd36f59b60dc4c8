"""One reader per slot: exactly the ops that touch the replication slot are in ``pgcdc_slot``.

Two views of the same rule (design §3.8):

* the Definitions: every op of every job, with the pool Dagster will enforce, against the
  list below of what touches the slot and why;
* the source of ``pgcdc_dagster/assets/``: every Dagster-decorated function that calls an
  engine entry point which peeks, advances or drops the slot is declared with
  ``pool=names.pool`` (the capture's pool), and no other is (so a new slot reader without
  the pool, or a pool on a non-reader, fails here).
"""

from __future__ import annotations

import ast
from pathlib import Path

import dagster as dg
import pytest

from pgcdc_dagster.assets import CAPTURE_POOL
from pgcdc_dagster.definitions import build_definitions
from pgcdc_dagster.ops.settings import MonitorSettings
from pgcdc_dagster.resources import (
    CaptureResource,
    LakehouseResource,
    PostgresResource,
    SparkResource,
)

pytestmark = [pytest.mark.dagster, pytest.mark.unit]

ASSETS = Path(__file__).resolve().parents[2] / "pgcdc_dagster" / "assets"

SLOT_OPS = {
    "capture": "cdc_microbatch / initial_snapshot: peeks slot windows, advances the slot, "
               "creates it in initial_snapshot",
    "incremental__snapshot": "reads slot windows between DBLog watermarks, advances the slot",
    "check_sweep": "capture_checks: peeks the slot for changes pending since silver's LSN, "
                   "compares the slot's position with the runs' LSN ranges",
    "silver_matches_source": "peeks the slot for changes pending since silver's LSN",
    "bronze_lsn_windows": "compares the slot's confirmed position with the runs' LSN ranges; "
                          "a capture running meanwhile would move it under the check",
    "drop_slot_and_publication": "drops the slot",
}
"""Ops that touch the slot, by op name."""

NOT_SLOT_OPS = {
    "silver_schema_matches_source": "compares the catalog with the silver schema",
    "source__replication_slot_slot_healthy": "reads pg_replication_slots / pg_stat_* views",
    "apply_incremental_signal": "records a signal in the lakehouse progress store",
    "purge_silver_tombstones": "deletes expired tombstones from silver Delta tables",
    "compact_vacuum_checkpoint": "compacts, vacuums and checkpoints Delta tables; races with "
    "micro-batches are settled by Delta commit conflicts (tests/integration/test_upkeep_race.py)",
}

SLOT_ENTRY_POINTS = {
    "run_bronze",          # capture.runner: snapshot + stream windows, slot advance
    "bronze",              # capture.run_context.RunContext.bronze: run_bronze of the run
    "run_incremental",     # capture.incremental: DBLog windows, slot advance
    "compare_with_source", "compare_tables",  # ops.consistency: peek_window on the slot
    "teardown",            # ops.teardown: drop_slot
    "peek_window", "advance_slot", "drop_slot", "create_slot_with_snapshot",
}
"""Engine functions that peek, advance, create or drop the slot itself."""

DAGSTER_DECORATORS = {"asset", "multi_asset", "asset_check", "multi_asset_check", "multi_check",
                      "op"}


def definitions() -> dg.Definitions:
    return build_definitions([("public", "items"), ("public", "tags")], {
        "postgres": PostgresResource(dsn="host=127.0.0.1 dbname=unused"),
        "lakehouse": LakehouseResource(root="/nonexistent"),
        "capture": CaptureResource(tables="public\\..*"),
        "spark": SparkResource(),
    }, settings=MonitorSettings())


def test_every_op_that_touches_the_slot_is_in_the_pool_and_no_other() -> None:
    pools: dict[str, str | None] = {}
    for job in definitions().get_repository_def().get_all_jobs():
        for node in job.graph.node_defs:
            assert isinstance(node, dg.OpDefinition)
            pools[node.name] = node.pool
    assert set(pools) == set(SLOT_OPS) | set(NOT_SLOT_OPS), "classify the new op above"
    assert {name for name, pool in pools.items() if pool == CAPTURE_POOL} == set(SLOT_OPS)
    assert {name for name, pool in pools.items() if pool is None} == set(NOT_SLOT_OPS)


def _decorator(node: ast.expr) -> tuple[str | None, bool]:
    """(Dagster decorator name, whether it passes pool=names.pool)."""
    call = node if isinstance(node, ast.Call) else None
    target = call.func if call else node
    name = target.attr if isinstance(target, ast.Attribute) else (
        target.id if isinstance(target, ast.Name) else None)
    if name not in DAGSTER_DECORATORS:
        return None, False
    pooled = any(k.arg == "pool" and isinstance(k.value, ast.Attribute)
                 and k.value.attr == "pool" for k in (call.keywords if call else []))
    return name, pooled


def _calls(function: ast.AST, siblings: dict[str, ast.FunctionDef] | None = None,
           seen: set[str] | None = None) -> set[str]:
    """Names the function calls, and those its sibling functions (defined beside it, e.g. the
    op body a decorated op delegates to) call when it calls them."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else
                      func.id if isinstance(func, ast.Name) else "")
    seen = seen if seen is not None else set()
    for name in sorted(names & set(siblings or {}) - seen):
        seen.add(name)
        names |= _calls((siblings or {})[name], siblings, seen)
    return names


def _functions(tree: ast.AST) -> list[tuple[ast.FunctionDef, dict[str, ast.FunctionDef]]]:
    """Every function with the functions defined beside it (same enclosing body)."""
    out = []
    for parent in ast.walk(tree):
        body = getattr(parent, "body", None)
        if not isinstance(body, list):
            continue
        defs = {n.name: n for n in body if isinstance(n, ast.FunctionDef)}
        out.extend((node, defs) for node in defs.values())
    return out


def test_assets_source_pools_exactly_the_slot_readers() -> None:
    seen: dict[str, tuple[bool, bool]] = {}
    for path in sorted(ASSETS.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node, siblings in _functions(tree):
            for deco in node.decorator_list:
                kind, pooled = _decorator(deco)
                if kind is None:
                    continue
                reads = bool(_calls(node, siblings) & SLOT_ENTRY_POINTS)
                seen[f"{path.name}:{node.name}"] = (reads, pooled)
    assert {"capture_run.py:capture_op", "check_sweep.py:check_sweep",
            "incremental.py:incremental_snapshot"} <= set(seen)
    wrong = {name: state for name, state in seen.items()
             if state[1] != (state[0] or name == "checks.py:bronze_lsn_windows")}
    assert not wrong, f"(reads the slot, in pool) disagree: {wrong}"
    assert sum(pooled for _, pooled in seen.values()) == len(SLOT_OPS), seen
