"""Dagster's public API only, and importing the package changes nothing in the process.

* No module of the package, ``assets/`` or ``resources/`` imports (or names) a private module
  of Dagster (``dagster._*``): those change without notice between Dagster releases.
* Every module of the package (``pkgutil.walk_packages``), ``assets`` and ``resources`` is
  imported in a fresh interpreter, which then reports what the imports changed: the garbage
  collector (enabled, thresholds, callbacks, frozen objects), the environment, the warning
  filters, the threads and the child processes must be as they were. The third-party
  packages the modules import are imported before the first look (numpy, for one, adds
  warning filters of its own when it loads): what is measured is what this project's code
  does. Process-level tuning is
  the deployment's explicit call (``pgcdc_dagster.tuning.tune_process``), tested apart.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("pgcdc_dagster", "assets", "resources")
PRIVATE_DAGSTER = re.compile(r"\bdagster(?:_[a-z]+)?\._")
"""``dagster._core...``, ``dagster_shared._...``: any private module of Dagster's packages,
imported or named in a string (``importlib.import_module``)."""


def _sources() -> list[Path]:
    return sorted(p for package in SCANNED for p in (ROOT / package).rglob("*.py"))


def test_no_private_dagster_module_is_used() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in _sources()
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if PRIVATE_DAGSTER.search(line)]
    assert found == []


def test_the_scan_finds_a_private_import() -> None:
    assert PRIVATE_DAGSTER.search("from dagster._core.events import DagsterEventType")
    assert PRIVATE_DAGSTER.search("import dagster._check as check")
    assert PRIVATE_DAGSTER.search('importlib.import_module("dagster_shared._x")')
    assert not PRIVATE_DAGSTER.search('_FINDER = "pgcdc_dagster._find"')


_PROBE = r"""
import ast, gc, json, os, pkgutil, sys, threading, warnings, importlib
ROOT, OURS = sys.argv[1], ("pgcdc_dagster", "assets", "resources")

def children():
    out = set()
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
            out.update(f.read().split())
    return sorted(out)

def state():
    return {"gc_enabled": gc.isenabled(), "gc_threshold": list(gc.get_threshold()),
            "gc_callbacks": len(gc.callbacks), "gc_frozen": gc.get_freeze_count(),
            "environ": dict(os.environ), "filters": [repr(f) for f in warnings.filters],
            "threads": sorted(t.name for t in threading.enumerate()),
            "children": children(), "excepthook": repr(sys.excepthook)}

def third_party():
    names = set()
    for package in OURS:
        for base, _, files in os.walk(os.path.join(ROOT, package)):
            for f in files:
                if f.endswith(".py"):
                    tree = ast.parse(open(os.path.join(base, f)).read())
                    for node in ast.walk(tree):
                        if isinstance(node, ast.Import):
                            names.update(a.name.split(".")[0] for a in node.names)
                        elif isinstance(node, ast.ImportFrom) and node.level == 0:
                            names.add(node.module.split(".")[0])
    return sorted(n for n in names if n not in sys.stdlib_module_names and n not in OURS)

for name in third_party():
    try:
        importlib.import_module(name)
    except ImportError:
        pass  # an optional extra not installed: none of our modules imports it at the top
before = state()
imported = []
for name in OURS:
    importlib.import_module(name)
    imported.append(name)
    # this checkout's directory only (the namespace package may span other installs)
    for info in pkgutil.walk_packages([os.path.join(ROOT, name)], name + "."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # a program (python -m), not an import
        importlib.import_module(info.name)
        imported.append(info.name)
print(json.dumps({"before": before, "after": state(), "imported": imported}))
"""


def test_importing_every_module_leaves_the_process_as_it_was() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGCDC_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(ROOT)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "pgcdc_dagster.definitions" in got["imported"]
    assert "pgcdc_dagster.assets.capture_run" in got["imported"]
    assert "pgcdc_dagster.resources.capture" in got["imported"]
    assert len(got["imported"]) > 100
    before, after = got["before"], got["after"]
    for name in before:
        assert after[name] == before[name], name


_TUNE = r"""
import gc, json, os, sys
from pgcdc_dagster.tuning import tune_process
tuned = tune_process()
import pyarrow as pa
print(json.dumps({"env": os.environ.get("ARROW_DEFAULT_MEMORY_POOL"), "set": tuned.arrow_env_set,
                  "pool": pa.default_memory_pool().backend_name, "frozen": tuned.frozen,
                  "freeze_count": gc.get_freeze_count(), "gc_enabled": gc.isenabled()}))
"""


def test_tuning_is_an_explicit_call() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", _TUNE], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["env"] == "jemalloc" and got["set"] is True  # called before pyarrow loaded
    assert got["pool"] == "jemalloc"
    assert got["frozen"] > 0 and got["freeze_count"] == got["frozen"]
    assert got["gc_enabled"] is True
