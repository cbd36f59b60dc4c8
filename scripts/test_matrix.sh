#!/usr/bin/env bash
# Run the version-sensitive tests against PostgreSQL 14-18 (binaries from scripts/install_pg.sh).
#
#   scripts/test_matrix.sh [--quick] [MAJOR ...] [-- PYTEST_ARGS...]
#
# Default versions: 14 15 16 17 18. The full matrix runs, per version: pgoutput reads (every
# protocol version the server offers, streaming), the failover tests (17+: failover slot across
# a promotion; 14-16: refusal, then when_needed), decoding from a standby (16+), slot
# invalidation and the slot health check, generated columns (18),
# stream convergence (pgoutput), crash recovery, the snapshot, snapshot-mode and incremental
# snapshot tests and the Debezium-parity tests. --quick (what scripts/test.sh runs for the
# versions other than the default) keeps the pgoutput, failover, invalidation,
# generated-column and standby-decoding tests.
# wal2json and decoderbufs are Debian packages of the system's version only: their cases run
# with the default suite, not here.
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
majors=()
extra=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --) shift; extra=("$@"); break ;;
    *) majors+=("$1") ;;
  esac
  shift
done
[ "${#majors[@]}" -eq 0 ] && majors=(14 15 16 17 18)

tests=(tests/integration/test_peek.py tests/integration/test_failover.py
       tests/integration/test_slot_invalidation.py tests/integration/test_version_differences.py
       tests/integration/test_standby_decoding.py)
if [ "$quick" -eq 0 ]; then
  tests+=(tests/dagster/test_slot_health_check.py tests/integration/test_stream_convergence.py
          tests/integration/test_crash_recovery.py tests/integration/test_snapshot.py
          tests/integration/test_snapshot_modes.py tests/integration/test_incremental.py
          tests/integration/test_debezium_parity.py)
fi

bash scripts/install_pg.sh "${majors[@]}" || true
export PYSPARK_PYTHON="$PWD/.venv/bin/python" SPARK_LOCAL_IP=127.0.0.1
failed=()
for major in "${majors[@]}"; do
  echo "== PostgreSQL $major: ${#tests[@]} test files"
  if ! PGCDC_TEST_PG_VERSION="$major" .venv/bin/pytest -q -p no:cacheprovider \
       -k "not wal2json and not decoderbufs" "${tests[@]}" "${extra[@]}"; then
    failed+=("$major")
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "test_matrix: failed on PostgreSQL ${failed[*]}" >&2
  exit 1
fi
echo "test_matrix: passed on PostgreSQL ${majors[*]}"
