#!/usr/bin/env bash
# Run the whole test suite (sets up what is missing first). Extra arguments go to pytest.
# Without arguments, the version-sensitive subset then runs on the other PostgreSQL versions
# (scripts/test_matrix.sh --quick; PGCDC_TEST_MATRIX_VERSIONS="" skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
.venv/bin/ruff check pgcdc_dagster assets resources tests bench
.venv/bin/mypy
if [ "$#" -gt 0 ]; then
  exec .venv/bin/pytest "$@"
fi
.venv/bin/pytest
versions="${PGCDC_TEST_MATRIX_VERSIONS-14 17 18}"
if [ -n "$versions" ]; then
  # shellcheck disable=SC2086
  bash scripts/test_matrix.sh --quick $versions
fi
