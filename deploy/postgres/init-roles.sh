#!/bin/sh
# Run by the postgres image once, when it creates the database (this directory is mounted at
# /docker-entrypoint-initdb.d). The superuser's password never leaves the postgres container.
set -eu
psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname "$POSTGRES_DB" \
  -v migrate_password="$POSTGRES_MIGRATE_PASSWORD" -v app_password="$POSTGRES_APP_PASSWORD" \
  -f "${ROLES_FILE:-/docker-entrypoint-initdb.d/roles.psql}"
