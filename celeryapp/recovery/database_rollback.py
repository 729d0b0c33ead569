"""A database that went back: detected by the ids Redis saw, and survived.

A failover to an asynchronous standby (or a restored backup) loses commits the old primary had
acknowledged, and the sequences behind the ids go back with them: the new primary hands out
again execution, worker task and activity ids that Redis, which kept its data, already knows.
Redis therefore keeps the highest id of each it has seen (:data:`keys.HIGH_WATER_KEY`): the
dispatch of every group notes its run's and its attempts' ids in the same script as their dispatch
markers (no round trip of its own), and each recovery pass notes the sequences it reads.

A pass that finds a sequence below its mark logs CRITICAL, moves the sequence past the mark (and
a margin: ids the marks never saw may have been used too), and makes recovery repair nothing for
one heartbeat TTL: steps whose claims were lost run on without their rows saying so, and their
heartbeats, written again within a TTL, tell recovery what not to touch
(:mod:`celeryapp.recovery.lost_claims`). Reused ids are harmless anyway (each run's Redis keys and
Celery task ids carry its random token); moving the sequences keeps the logs and the dashboard's
ids unambiguous too.

SQLite has no failover, but a database file put back from a backup goes back the same way: its
``sqlite_sequence`` rows are read and moved alike.
"""

from __future__ import annotations

import logging

import redis
from sqlalchemy import Connection, text
from sqlalchemy.exc import ProgrammingError

from celeryapp.domain.names import PREFIX
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis, registered_script
from celeryapp.runtime import Runtime
from models.session import autocommit, connection

logger = logging.getLogger(__name__)

#: The tables whose ids name things in Redis or in messages: runs (cancel flags, Celery task ids),
#: worker tasks (heartbeats, markers, fence and stop flags), activities (a runner closes its own).
WATCHED_TABLES = (keys.EXECUTIONS_MARK, keys.WORKER_TASKS_MARK, "activities")
#: How far past its mark a sequence that went back is moved: ids handed out on the lost timeline
#: after the mark's last update (at most a recovery interval of work) must not be handed out again.
SEQUENCE_MARGIN = 100_000
#: While present, recovery repairs nothing: the database went back less than a heartbeat TTL ago.
ROLLBACK_PAUSE_KEY = f"{PREFIX}:recovery:database-went-back"

#: KEYS[1]: the marks hash; ARGV: field, value, field, value, ... Raises each mark to its value.
_RAISE_MARKS_LUA = """
for i = 1, #ARGV, 2 do
  local seen = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > seen then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
"""


def _sequence(conn: Connection, table: str) -> int:
    """The last id ``table``'s sequence handed out (0: none yet)."""
    if conn.dialect.name == "postgresql":
        value = conn.execute(
            text("SELECT pg_sequence_last_value(pg_get_serial_sequence(:t, 'id')::regclass)"), {"t": table}
        ).scalar()
    else:
        value = conn.execute(text("SELECT seq FROM sqlite_sequence WHERE name = :t"), {"t": table}).scalar()
    return int(value or 0)


def _move_sequence(conn: Connection, table: str, past: int) -> None:
    """Make ``table``'s next id greater than ``past``, never lower than it is."""
    if conn.dialect.name == "postgresql":
        # Inserts take ROW EXCLUSIVE before drawing an id: none draws one between the read and setval.
        conn.execute(text(f'LOCK TABLE "{table}" IN SHARE ROW EXCLUSIVE MODE'))
        conn.execute(
            text(
                "SELECT setval(pg_get_serial_sequence(:t, 'id'), GREATEST(:v, "
                "COALESCE(pg_sequence_last_value(pg_get_serial_sequence(:t, 'id')::regclass), 0)))"
            ),
            {"t": table, "v": past},
        )
        return
    if (
        not conn.execute(
            text("UPDATE sqlite_sequence SET seq = :v WHERE name = :t AND seq < :v"), {"t": table, "v": past}
        ).rowcount
        and not conn.execute(text("SELECT 1 FROM sqlite_sequence WHERE name = :t"), {"t": table}).first()
    ):
        conn.execute(text("INSERT INTO sqlite_sequence (name, seq) VALUES (:t, :v)"), {"t": table, "v": past})


def check_database_went_back(app: Runtime) -> bool:
    """Compare the database's sequences with the ids Redis saw; on finding it went back, move the
    sequences past them and pause repairs for a TTL. Whether repairs are paused now."""
    settings = app.settings
    client = get_redis(settings.broker_url)
    with autocommit(settings.database_url, read_only=True) as conn:
        sequences = {table: _sequence(conn, table) for table in WATCHED_TABLES}
    marks = dict(zip(WATCHED_TABLES, client.hmget(keys.HIGH_WATER_KEY, WATCHED_TABLES), strict=True))
    behind = {t: int(m) for t, m in marks.items() if m is not None and int(m) > sequences[t]}
    if behind:
        logger.critical(
            "the database went back: its id sequences are behind ids Redis already saw (%s). Commits it had "
            "acknowledged are lost (a failover to an asynchronous standby, or a restored backup): what they "
            "recorded (claims, outcomes, fires) is done again where it must be (docs/operations.md). The "
            "sequences are moved %s past those ids; recovery repairs nothing for %gs",
            ", ".join(f"{t}: database at {sequences[t]}, seen {m}" for t, m in behind.items()),
            SEQUENCE_MARGIN,
            settings.heartbeat_ttl_s,
        )
        client.set(ROLLBACK_PAUSE_KEY, "1", px=int(settings.heartbeat_ttl_s * 1000))
        for table, seen in behind.items():
            try:
                with connection(settings.database_url) as conn:
                    _move_sequence(conn, table, seen + SEQUENCE_MARGIN)
            except ProgrammingError as exc:
                # A role without UPDATE on the sequences (deploy/postgres/roles.psql grants it). The
                # runs' tokens keep reused ids apart; the marks come down so that the pause is once.
                logger.critical("the sequence of %s could not be moved past %s: %s", table, seen, exc.orig)
                client.hset(keys.HIGH_WATER_KEY, table, sequences[table])
                continue
            sequences[table] = seen + SEQUENCE_MARGIN
    raise_marks(client, sequences)
    return bool(behind) or bool(client.exists(ROLLBACK_PAUSE_KEY))


def raise_marks(client: redis.Redis, seen: dict[str, int]) -> None:
    """Note ids as seen (each mark only ever goes up)."""
    args = [v for table, value in seen.items() if value for v in (table, value)]
    if args:
        registered_script(client, _RAISE_MARKS_LUA)(keys=[keys.HIGH_WATER_KEY], args=args)
