"""`make run`'s last word: once everything answers, the addresses and credentials, printed once.

Printed before the processes start, they would scroll away among the start-up logs; so this
waits until Redis answers PING, a worker and beat keep their liveness files fresh, and the
dashboard and Flower answer HTTP, prints the banner file ``run.sh`` wrote, then waits to be
stopped with the others (honcho stops everything when one process exits).

    python deploy/local/ready.py BANNER_FILE
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import redis

#: Seconds between two looks at what answers.
POLL_S = 0.5
#: Seconds after which, and then as often, it says what it is still waiting for.
REMIND_EVERY_S = 30.0
#: A liveness file older than this is a process not (yet) alive; they are touched every 10 s.
FRESH_S = 30.0


def http_answers(url: str) -> bool:
    """Any HTTP answer counts (a login page, a 401): the server is up."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping())
    except (redis.RedisError, ValueError):
        return False


def fresh(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime < FRESH_S
    except OSError:
        return False


def not_answering(env: dict[str, str]) -> list[str]:
    """What does not answer yet, in people's names."""
    health = Path(env.get("CHORDBEAT_HEALTH_DIR", ".run"))
    checks = {
        "Redis": lambda: redis_answers(env.get("CHORDBEAT_BROKER_URL", "redis://127.0.0.1:6379/0")),
        "a worker": lambda: fresh(health / "chordbeat-worker.health"),
        "beat": lambda: fresh(health / "chordbeat-beat.health"),
        "the dashboard": lambda: http_answers(f"http://127.0.0.1:{env.get('CHORDBEAT_WEB_PORT') or 8180}/"),
        "Flower": lambda: http_answers(f"http://127.0.0.1:{env.get('FLOWER_PORT') or 5555}/healthcheck"),
    }
    return [name for name, check in checks.items() if not check()]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: ready.py BANNER_FILE", file=sys.stderr)
        return 2
    stopped = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopped
        stopped = True

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    started = reminded = time.monotonic()
    while not stopped:
        missing = not_answering(dict(os.environ))
        if not missing:
            print(Path(argv[0]).read_text().rstrip("\n"), flush=True)
            break
        if time.monotonic() - reminded >= REMIND_EVERY_S:
            waited = time.monotonic() - started
            print(f"still waiting for {', '.join(missing)} ({waited:.0f} s); see their lines above", flush=True)
            reminded = time.monotonic()
        time.sleep(POLL_S)
    while not stopped:
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
