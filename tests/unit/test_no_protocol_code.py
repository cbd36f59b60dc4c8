"""The package owns no database protocol code and compiles nothing at run time.

Bulk reads go through ADBC's PostgreSQL driver (``postgres/arrow_reader.py``), everything
else through psycopg2: no module that talks to PostgreSQL touches a connection's socket
(its file descriptor, ``socket``/``select`` on it, raw reads or writes), and no module of the
package runs a C compiler or loads a library it built.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pgcdc_dagster"
DATABASE_LAYERS = ("postgres", "capture", "cdc", "ops", "lake")
"""Packages that hold every PostgreSQL read and its decoding."""
SOCKET_MODULES = {"socket", "select", "selectors", "ctypes", "cffi", "mmap"}
COMPILERS = {"cc", "gcc", "clang", "c++", "g++"}


def _modules(*parts: str) -> list[Path]:
    return sorted(p for part in parts for p in (PACKAGE / part).rglob("*.py"))


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_database_code_never_touches_a_connection_socket() -> None:
    offenders = []
    for path in _modules(*DATABASE_LAYERS):
        if path.name == "local_cluster.py":
            continue  # starts a test server: asks the kernel for a free port, no connection
        tree = ast.parse(path.read_text(), str(path))
        bad = _imports(tree) & SOCKET_MODULES
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("fileno", "socket", "fromfd"):
                bad.add(node.attr)
        if bad:
            offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert offenders == []


def test_nothing_is_compiled_at_run_time() -> None:
    sources = [p.relative_to(ROOT) for p in PACKAGE.rglob("*")
               if p.suffix in (".c", ".h", ".so", ".pyx")]
    assert sources == []
    offenders = []
    for path in _modules("."):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in COMPILERS:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert offenders == []
