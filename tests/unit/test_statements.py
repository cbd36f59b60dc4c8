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


def _is_text(node: ast.expr, names: set[str]) -> bool:
    """Constant text: a string literal, a name bound to constant text, or a concatenation or
    f-string of those (no value from outside the module's constants)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_text(node.left, names) and _is_text(node.right, names)
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(v, ast.Constant)
                   or (isinstance(v, ast.FormattedValue) and _is_text(v.value, names))
                   for v in node.values)
    return False


def _constant_strings(tree: ast.Module, imported: set[str] | None = None) -> set[str]:
    """Module-level names bound to constant text (``imported``: names the module imports
    from modules of the package where they are constant text)."""
    out = set(imported or ())
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_text(node.value, out):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return out


def _package_constants(files: list[Path]) -> dict[str, set[str]]:
    """Each package module's constant-text names (``pgcdc_dagster.x.y`` -> names)."""
    root = PACKAGES[0].parent
    return {".".join(f.relative_to(root).with_suffix("").parts):
            _constant_strings(ast.parse(f.read_text())) for f in files}


def _imported_constants(tree: ast.Module, constants: dict[str, set[str]]) -> set[str]:
    return {alias.asname or alias.name for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module in constants
            for alias in node.names if alias.name in constants[node.module]}


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
    package_constants = _package_constants(files)
    for path in files:
        tree = ast.parse(path.read_text())
        if _sqlite_only(tree):
            continue
        constants = _constant_strings(tree, _imported_constants(tree, package_constants))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("execute", "executemany", "mogrify")
                    and len(node.args) + len(node.keywords) >= 2):
                continue
            query = node.args[0] if node.args else node.keywords[0].value
            if _is_text(query, constants):
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
