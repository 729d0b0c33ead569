#!/bin/bash
# compose's Redis: renders users.acl with the SHA-256 of each role's password, read from the
# environment, and runs Redis with it. No password or hash is ever an argument of a command (ps
# shows every process's arguments to every user): printf and the substitutions are bash's own.
# Arguments are handed on to redis-server (the tests give a port and a directory).
set -euo pipefail
umask 077
template=${REDIS_ACL_TEMPLATE:-/etc/chordbeat-redis/users.acl}
rendered=${REDIS_ACL_RENDERED:-/tmp/users.acl}
sha() { printf %s "$1" | sha256sum | cut -c1-64; }
acl=$(< "$template")
acl=${acl//'${REDIS_ACL_APP_SHA256}'/$(sha "${REDIS_APP_PASSWORD:?}")}
acl=${acl//'${REDIS_ACL_SERVICE_SHA256}'/$(sha "${REDIS_SERVICE_PASSWORD:?}")}
acl=${acl//'${REDIS_ACL_MONITOR_SHA256}'/$(sha "${REDIS_MONITOR_PASSWORD:?}")}
if [[ $acl == *'${'* ]]; then
  echo "start.sh: $template names a password this script does not render" >&2
  exit 1
fi
printf '%s\n' "$acl" > "$rendered"
unset REDIS_APP_PASSWORD REDIS_SERVICE_PASSWORD REDIS_MONITOR_PASSWORD
# AOF so a restart keeps queues and beat entries; noeviction so Redis never drops an entry or a
# message to make room.
exec redis-server --appendonly yes --maxmemory-policy noeviction --aclfile "$rendered" "$@"
