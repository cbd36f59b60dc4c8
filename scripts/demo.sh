#!/usr/bin/env bash
# Run the demo end to end on an embedded default: a throwaway PostgreSQL under .demo/,
# local Spark, Delta tables in .demo/lakehouse. Extra arguments go to the demo
# (--keep leaves PostgreSQL running for `dagster dev`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
exec .venv/bin/python -m pgcdc_dagster.demo "$@"
