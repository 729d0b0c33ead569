#!/usr/bin/env bash
# `make run`: step worker, control worker, beat, Flower and the dashboard (and Redis if none answers) in the
# foreground. Each process is started again when it dies (deploy/local/respawn.py); Ctrl-C stops
# them all, Redis last (deploy/local/supervise.py). State and generated local credentials live in
# $CHORDBEAT_RUN_DIR (default .run/).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/.venv/bin:$PATH"
export CHORDBEAT_RUN_DIR="${CHORDBEAT_RUN_DIR:-$PWD/.run}"
run_dir=$CHORDBEAT_RUN_DIR
umask 077
mkdir -p "$run_dir"
chmod 700 "$run_dir"
export CHORDBEAT_SCHEDULES_FILE="${CHORDBEAT_SCHEDULES_FILE:-$PWD/examples/schedules.yaml}"
export CHORDBEAT_CALENDARS_DIR="${CHORDBEAT_CALENDARS_DIR:-$PWD/deploy/calendars}"
export CHORDBEAT_HEALTH_DIR="${CHORDBEAT_HEALTH_DIR:-$run_dir}"
export FLOWER_DB="${FLOWER_DB:-$run_dir/flower.db}"
# Alerts (docs/alerts.md): a channels file named relative to this checkout works from any directory
# the CLI is run in (cli.env below carries the name).
if [ -n "${CHORDBEAT_ALERT_CHANNELS:-}" ] && [ "${CHORDBEAT_ALERT_CHANNELS#/}" = "$CHORDBEAT_ALERT_CHANNELS" ]; then
  export CHORDBEAT_ALERT_CHANNELS="$PWD/$CHORDBEAT_ALERT_CHANNELS"
fi

# Random local credentials, made once and reused so a browser login survives restarts.
if [ ! -s "$run_dir/local.env" ]; then
  python - > "$run_dir/local.env" <<'PY'
import secrets
print(f"LOCAL_FLOWER_PASSWORD={secrets.token_urlsafe(18)}")
print(f"LOCAL_FLOWER_COOKIE_SECRET={secrets.token_urlsafe(32)}")
print(f"LOCAL_REDIS_PASSWORD={secrets.token_urlsafe(24)}")
PY
fi
# Dashboard credentials, added to a local.env made before the dashboard existed.
if ! grep -q '^LOCAL_WEB_PASSWORD=' "$run_dir/local.env"; then
  python - >> "$run_dir/local.env" <<'PY'
import secrets
print(f"LOCAL_WEB_PASSWORD={secrets.token_urlsafe(18)}")
print(f"LOCAL_WEB_SECRET={secrets.token_urlsafe(32)}")
PY
fi
# shellcheck source=/dev/null
. "$run_dir/local.env"
# Who logs in where: said first, and again in the banner once everything answers.
web_login="your CHORDBEAT_WEB_USERS"
flower_login="your FLOWER_BASIC_AUTH"
if [ -z "${FLOWER_BASIC_AUTH:-}" ]; then
  export FLOWER_BASIC_AUTH="chordbeat:$LOCAL_FLOWER_PASSWORD"
  flower_login="user chordbeat, password $LOCAL_FLOWER_PASSWORD"
fi
export FLOWER_COOKIE_SECRET="${FLOWER_COOKIE_SECRET:-$LOCAL_FLOWER_COOKIE_SECRET}"
if [ -z "${CHORDBEAT_WEB_USERS:-}" ]; then
  # One local admin with a plain password (this machine only; hash passwords anywhere else).
  export CHORDBEAT_WEB_USERS="admin:admin:$LOCAL_WEB_PASSWORD"
  web_login="user admin, password $LOCAL_WEB_PASSWORD"
fi
export CHORDBEAT_WEB_SECRET="${CHORDBEAT_WEB_SECRET:-$LOCAL_WEB_SECRET}"
web_url="http://127.0.0.1:${CHORDBEAT_WEB_PORT:-8180}"
flower_url="http://127.0.0.1:${FLOWER_PORT:-5555}"
# The dashboard's Health page links to Flower and asks whether it answers.
export CHORDBEAT_FLOWER_URL="${CHORDBEAT_FLOWER_URL:-$flower_url}"
echo "Dashboard: $web_url ($web_login)"
echo "Flower:    $flower_url ($flower_login)"

masked() { sed -E 's#(://[^:/@]*):[^@/]*@#\1:**@#' <<<"$1"; }
# The URL (with its password) goes in the environment, never in python's arguments, which ps shows.
answers() { REDIS_URL_TRIED="$1" python -c "import os, redis; redis.Redis.from_url(os.environ['REDIS_URL_TRIED'], socket_connect_timeout=1).ping()" 2>/dev/null; }
processes="worker control beat flower web ready"
# Servers the processes talk to, started first and stopped last (deploy/local/supervise.py).
servers=()
if [ -z "${CHORDBEAT_BROKER_URL:-}" ]; then
  redis_port="${CHORDBEAT_LOCAL_REDIS_PORT:-6379}"
  ours="redis://:$LOCAL_REDIS_PASSWORD@127.0.0.1:$redis_port/0"
  if answers "$ours"; then
    export CHORDBEAT_BROKER_URL="$ours"
  elif answers "redis://127.0.0.1:$redis_port/0"; then
    export CHORDBEAT_BROKER_URL="redis://127.0.0.1:$redis_port/0"
  else
    echo "no Redis answers at 127.0.0.1:$redis_port: starting one with a password (data and log in $run_dir)"
    cat > "$run_dir/redis.conf" <<CONF
port $redis_port
bind 127.0.0.1
dir "$run_dir"
logfile "$run_dir/redis.log"
appendonly yes
maxmemory-policy noeviction
requirepass $LOCAL_REDIS_PASSWORD
CONF
    export CHORDBEAT_BROKER_URL="$ours"
    servers=(--server "python deploy/local/respawn.py redis-server $run_dir/redis.conf")
  fi
fi
echo "broker:    $(masked "$CHORDBEAT_BROKER_URL")"
# The CLI in another terminal needs the same settings: the broker's generated password, and the
# task modules (and where they are found) and step policy, as the workers have them, so that
# `chordbeat apply FILE` checks a step against the same tasks when no worker has said what it has;
# and what else apply checks a definition against: the alert channels' names and the calendars.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for name in PATH PYTHONPATH CHORDBEAT_BROKER_URL CHORDBEAT_DATABASE_URL CHORDBEAT_HEALTH_DIR \
  CHORDBEAT_TASK_MODULES CHORDBEAT_STEP_TASKS CHORDBEAT_STEP_KINDS CHORDBEAT_EXECUTABLE_ALLOW \
  CHORDBEAT_SQL_ENV_PREFIX CHORDBEAT_ALERT_CHANNELS CHORDBEAT_CALENDARS_DIR CHORDBEAT_DASHBOARD_URL; do
  if [ -n "${!name:-}" ]; then printf 'export %s=%q\n' "$name" "${!name}"; fi
done > "$run_dir/cli.env"
# Printed by deploy/local/ready.py once everything answers, after the start-up logs.
cat > "$run_dir/banner.txt" <<BANNER
---------------------------------------------------------------
chordbeat is up
  Dashboard: $web_url
             $web_login
  Flower:    $flower_url
             $flower_login
  (kept in $run_dir/local.env)
  CLI, in another terminal:
    . $run_dir/cli.env
    chordbeat run nightly-hr-sync --wait
---------------------------------------------------------------
BANNER
chordbeat db upgrade
# Beat applies $CHORDBEAT_SCHEDULES_FILE when it starts, once Redis answers, and prunes the
# schedules the file dropped. (Applied here too, before Redis started, it warned "beat entries not
# updated (Connection refused)" at every start.)
# Ctrl-C stops the processes first, then the servers, and ends with status 0 (supervise.py says why).
exec python deploy/local/supervise.py "${servers[@]}" -- honcho -f deploy/local/Procfile start $processes
