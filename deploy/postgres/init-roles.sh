#!/bin/sh
# Run by the postgres image once, when it creates the database (this directory is mounted at
# /docker-entrypoint-initdb.d). The superuser's password never leaves the postgres container.
# The roles' passwords reach psql in its environment (roles.psql reads them with \getenv), not
# in its arguments, which ps shows to every user.
set -eu
: "${POSTGRES_MIGRATE_PASSWORD:?}" "${POSTGRES_APP_PASSWORD:?}"
psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname "$POSTGRES_DB" \
  -f "${ROLES_FILE:-/docker-entrypoint-initdb.d/roles.psql}"
