"""Layout guards: the pure core stays pure, and the top-level packages are ours."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_CORE = ("dagster", "psycopg2", "pyspark", "deltalake", "assets", "resources",
                     "pgcdc_dagster.assets", "pgcdc_dagster.resources",
                     "pgcdc_dagster.postgres", "pgcdc_dagster.spark", "pgcdc_dagster.lake",
                     "pgcdc_dagster.capture", "socket", "subprocess")
FORBIDDEN_IN_ADAPTERS = ("dagster", "assets", "resources", "pgcdc_dagster.assets",
                         "pgcdc_dagster.resources")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_core_is_pure() -> None:
    assert _violations("pgcdc_dagster/cdc", FORBIDDEN_IN_CORE) == []


@pytest.mark.parametrize("package", ["pgcdc_dagster/postgres", "pgcdc_dagster/spark",
                                     "pgcdc_dagster/lake", "pgcdc_dagster/capture"])
def test_adapters_do_not_import_dagster(package: str) -> None:
    assert _violations(package, FORBIDDEN_IN_ADAPTERS) == []


def test_the_wheel_installs_pgcdc_dagster_only() -> None:
    """Nothing but ``pgcdc_dagster`` is a top-level package of the wheel: a user's project
    keeps its own ``assets`` / ``resources`` packages."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["pgcdc_dagster*"]


def test_dagster_layer_resolves_to_this_repository() -> None:
    import pgcdc_dagster.assets
    import pgcdc_dagster.resources

    for module in (pgcdc_dagster.assets, pgcdc_dagster.resources):
        assert Path(module.__file__ or "").resolve().is_relative_to(ROOT), module.__file__
