#!/usr/bin/env bash
# Makes sure redis-server, the PostgreSQL server binaries and Chromium with its driver exist; installs Debian's packages
# when they are missing and we are root, otherwise says what to install.
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
# The dashboard's browser tests drive Debian's Chromium through its chromedriver (nothing downloaded).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# npm installs axe-core (the Makefile's AXE_STAMP) for the dashboard's accessibility test.
command -v npm >/dev/null 2>&1 || missing+=(npm)
# The multi-host lab: clock skew per process, Redis Sentinel, network namespaces and partitions.
ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || missing+=(faketime)
command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
# PostgreSQL behind a connection pooler in transaction pooling (the suite's pgbouncer runs).
command -v pgbouncer >/dev/null 2>&1 || missing+=(pgbouncer)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${missing[*]} from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The packages may start system services; the project runs its own servers.
  service redis-server stop >/dev/null 2>&1 || true
  service redis-sentinel stop >/dev/null 2>&1 || true
  service pgbouncer stop >/dev/null 2>&1 || true
else
  echo "missing: ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
