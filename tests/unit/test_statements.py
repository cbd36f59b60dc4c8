"""Statements holding source names never get %-formatted: the rule of
``postgres/statements.py`` held over the whole package, and ``bind`` itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from psycopg2 import sql

from pgcdc_dagster.postgres.statements import bind

pytestmark = pytest.mark.unit

PACKAGES = [Path(__file__).resolve().parents[2] / "pgcdc_dagster"]


def _constant_strings(tree: ast.Module) -> set[str]:
    """Module-level names bound to a constant ``str``."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return out


def _sqlite_only(tree: ast.Module) -> bool:
    """A module that imports ``sqlite3`` and not ``psycopg2``: its statements run on SQLite
    connections (Dagster's event storage), whose ``?`` placeholders format nothing."""
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    return "sqlite3" in imported and "psycopg2" not in imported


def test_no_statement_but_constant_text_is_executed_with_parameters() -> None:
    """``cursor.execute(q, params)`` %-formats all of ``q``: with a ``sql.Composed`` that
    holds a name such as ``a%2Fb`` it breaks. Such a statement goes through
    ``statements.execute`` (placeholders bound as literals) instead. Modules on SQLite
    only are not concerned (qmark placeholders)."""
    offenders = []
    files = [f for p in PACKAGES for f in p.rglob("*.py") if f.name != "statements.py"]
    assert len(files) > 100
    for path in files:
        tree = ast.parse(path.read_text())
        if _sqlite_only(tree):
            continue
        constants = _constant_strings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("execute", "executemany", "mogrify")
                    and len(node.args) + len(node.keywords) >= 2):
                continue
            query = node.args[0] if node.args else node.keywords[0].value
            if isinstance(query, ast.Constant) and isinstance(query.value, str):
                continue
            if isinstance(query, ast.Name) and query.id in constants:
                continue
            if isinstance(node.func.value, ast.Name) and node.func.value.id == "run":
                continue  # not a cursor (a snapshot run's execute)
            offenders.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not offenders, offenders


def test_bind_replaces_placeholders_in_order_and_checks_the_count() -> None:
    query = sql.SQL("SELECT {} FROM {} WHERE a = {} AND b = {}").format(
        sql.Identifier("x%s"), sql.Identifier("t%(k)s"), sql.Placeholder(), sql.Placeholder())
    bound = bind(query, [1, "%s"])
    literals = [p for p in _leaves(bound) if isinstance(p, sql.Literal)]
    assert [lit.wrapped for lit in literals] == [1, "%s"]
    assert not [p for p in _leaves(bound) if isinstance(p, sql.Placeholder)]
    with pytest.raises(ValueError, match="more placeholders"):
        bind(query, [1])
    with pytest.raises(ValueError, match="3 values for 2"):
        bind(query, [1, 2, 3])
    with pytest.raises(ValueError, match="positional"):
        bind(sql.SQL("{}").format(sql.Placeholder("k")), [1])


def _leaves(part: sql.Composable) -> list[sql.Composable]:
    if isinstance(part, sql.Composed):
        return [leaf for p in part.seq for leaf in _leaves(p)]
    return [part]
