"""The package reaches Spark through public pyspark API only: no private attribute of pyspark
objects, no SparkContext, no RDD, no py4j. The same code then runs on an embedded session, a
cluster and a Spark Connect server (which has neither a SparkContext nor RDDs)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pgcdc_dagster", "assets", "resources")
PYSPARK_PRIVATE = {
    "_jsc", "_jvm", "_gateway", "_jdf", "_jsparkSession", "_jconf", "_jrdd", "_jmap", "_sc",
    "_active_spark_context", "_instantiatedSession", "_activeSession", "_python_includes",
    "_accumulatorServer", "_conf", "_ensure_initialized", "_do_init", "_launch_gateway",
}
FORBIDDEN_NAMES = {"SparkContext", "sparkContext", "parallelize", "rdd", "accumulator",
                   "setJobGroup", "cancelJobGroup", "statusTracker"}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and (
                node.attr in PYSPARK_PRIVATE or node.attr in FORBIDDEN_NAMES):
            found.append(f"{where} .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(f"{where} {node.id}")
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module.split(".")[0] in ("pyspark", "py4j")):
            names = [a.name for a in node.names]
            if node.module.split(".")[0] == "py4j" or any(
                    part.startswith("_") for part in node.module.split(".")) or any(
                    n.startswith("_") or n in FORBIDDEN_NAMES for n in names) or \
                    node.module.startswith("pyspark.core"):
                found.append(f"{where} from {node.module} import {', '.join(names)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "py4j" or alias.name.startswith("pyspark.core"):
                    found.append(f"{where} import {alias.name}")
    return found


def test_the_package_uses_no_private_pyspark_attribute_and_no_spark_context() -> None:
    sources = _sources()
    assert any(p.name == "chunk_jobs.py" for p in sources)  # the scan sees the package
    offences = [o for p in sources for o in _offences(p)]
    assert offences == [], offences


def test_the_scan_catches_what_it_forbids(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from pyspark import SparkContext\n"
                      "def f(spark):\n"
                      "    spark.sparkContext.parallelize([1]).collect()\n"
                      "    return spark._jsc, spark._jvm\n")
    found = " ".join(_offences_of(sample))
    for word in ("SparkContext", ".sparkContext", ".parallelize", "._jsc", "._jvm"):
        assert word in found, found


def _offences_of(path: Path) -> list[str]:
    global ROOT
    saved, ROOT = ROOT, path.parent
    try:
        return _offences(path)
    finally:
        ROOT = saved
