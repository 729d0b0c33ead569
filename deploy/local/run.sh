#!/usr/bin/env bash
# `make run`: Redis (if none answers), worker, beat and Flower in the foreground; Ctrl-C stops all.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p .run
export CHORDBEAT_SCHEDULES_FILE="${CHORDBEAT_SCHEDULES_FILE:-$PWD/examples/schedules.yaml}"
export CHORDBEAT_HEALTH_DIR="${CHORDBEAT_HEALTH_DIR:-$PWD/.run}"
if [ -z "${FLOWER_BASIC_AUTH:-}" ]; then
  export FLOWER_BASIC_AUTH="chordbeat:chordbeat-local"
  echo "Flower: http://127.0.0.1:5555 (user chordbeat, password chordbeat-local; set FLOWER_BASIC_AUTH to change)"
fi
export FLOWER_COOKIE_SECRET="${FLOWER_COOKIE_SECRET:-local-development-only}"
export FLOWER_DB="${FLOWER_DB:-$PWD/.run/flower.db}"
broker="${CHORDBEAT_BROKER_URL:-redis://127.0.0.1:6379/0}"
processes="worker beat flower"
if ! python -c "import redis,sys; redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1).ping()" "$broker" 2>/dev/null; then
  echo "no Redis answers at $broker: starting one (data in .run/)"
  processes="redis $processes"
fi
chordbeat db upgrade
chordbeat apply "$CHORDBEAT_SCHEDULES_FILE"
exec honcho -f deploy/local/Procfile start $processes
