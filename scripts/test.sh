#!/usr/bin/env bash
# Run the whole test suite (sets up what is missing first). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
.venv/bin/ruff check pgcdc_dagster assets resources tests bench
.venv/bin/mypy
exec .venv/bin/pytest "$@"
