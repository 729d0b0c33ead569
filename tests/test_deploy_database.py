"""The deploy files' database roles, for real: migrations as the owner role, everything else as a
runtime role that is no superuser and cannot change the schema."""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc
from celery import Celery
from sqlalchemy import create_engine, text

from celeryapp.application import ChordbeatCelery
from celeryapp.config import Settings
from celeryapp.messaging import keys
from celeryapp.messaging.redis_client import get_redis
from celeryapp.recovery.database_rollback import ROLLBACK_PAUSE_KEY, SEQUENCE_MARGIN, check_database_went_back
from celeryapp.recovery.housekeeping import purge
from models.migrate import upgrade
from models.session import dispose_all
from tests.support.helpers import call, finished, step
from tests.support.servers import PostgresServer, RedisServer

ROOT = Path(__file__).resolve().parent.parent
_numbers = itertools.count(1)


def role_url(server: PostgresServer, role: str, database: str) -> str:
    return f"postgresql+psycopg://{role}@127.0.0.1:{server.port}/{database}"


@pytest.fixture
def roles_database(postgres_server: PostgresServer) -> Iterator[str]:
    """A database set up as the compose file's postgres service does, migrated by the owner role."""
    name = f"roles_{os.getpid()}_{next(_numbers)}"
    admin = create_engine(postgres_server.url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
        # Roles are cluster-wide: a previous test's are dropped with their database's objects.
        conn.execute(text("DROP ROLE IF EXISTS chordbeat_app, chordbeat_migrate"))
    env = {
        **os.environ,
        "PATH": f"{postgres_server.bin}:{os.environ['PATH']}",
        "PGHOST": "127.0.0.1",
        "PGPORT": str(postgres_server.port),
        "POSTGRES_USER": postgres_server.user,
        "POSTGRES_DB": name,
        "POSTGRES_MIGRATE_PASSWORD": "migrate-pw-3vq8",
        "POSTGRES_APP_PASSWORD": "app-pw-71kd",
        "ROLES_FILE": str(ROOT / "deploy" / "postgres" / "roles.psql"),
    }
    subprocess.run(
        [str(ROOT / "deploy" / "postgres" / "init-roles.sh")], env=env, check=True, capture_output=True, timeout=60
    )
    upgrade(role_url(postgres_server, "chordbeat_migrate", name))
    yield name
    dispose_all()
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        conn.execute(text("DROP ROLE IF EXISTS chordbeat_app, chordbeat_migrate"))
    admin.dispose()


@pytest.fixture
def settings(
    redis_server: RedisServer, postgres_server: PostgresServer, roles_database: str, tmp_path: Path
) -> Settings:
    return Settings(
        broker_url=redis_server.url,
        result_backend=redis_server.url,
        redbeat_url=redis_server.url,
        database_url=role_url(postgres_server, "chordbeat_app", roles_database),
        heartbeat_ttl_s=3,
        recovery_interval_s=1,
        health_dir=str(tmp_path),
    )


def test_the_runtime_role_runs_everything_but_cannot_change_the_schema(
    app: ChordbeatCelery, worker: Any, client: Celery, settings: Settings
) -> None:
    call(client, "chordbeat.apply_schedule", definition={"name": "roles", "every": 60, "steps": [step("a"), step("b")]})
    done = finished(client, call(client, "chordbeat.trigger_schedule", name="roles")["execution_id"])
    assert done["status"] == "completed", done["error"]
    slow = call(client, "chordbeat.apply_schedule", definition={"name": "slow", "every": 60, "steps": [step("s")]})
    assert slow["status"] == "active"
    call(client, "chordbeat.pause_schedule", name="slow")
    call(client, "chordbeat.delete_schedule", name="slow")
    assert call(client, "chordbeat.list_slots", name="roles")[0]["outcome"] == "fired"
    purge(app)

    engine = create_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            assert (
                conn.scalar(
                    text("SELECT rolsuper OR rolcreaterole OR rolcreatedb FROM pg_roles WHERE rolname = current_user")
                )
                is False
            )
        for ddl in (
            "CREATE TABLE intruder (id int)",
            "DROP TABLE activities",
            "ALTER TABLE schedules ADD COLUMN x int",
        ):
            with (
                engine.connect() as conn,
                pytest.raises(sqlalchemy.exc.ProgrammingError, match=r"(permission denied|must be owner)"),
            ):
                conn.execute(text(ddl))
    finally:
        engine.dispose()


def test_the_runtime_role_moves_a_sequence_that_went_back(app: ChordbeatCelery, settings: Settings) -> None:
    """After a failover to an asynchronous standby recovery moves the sequences past the ids
    Redis saw: UPDATE on the sequences, granted by roles.psql."""
    get_redis(settings.broker_url).hset(keys.HIGH_WATER_KEY, keys.EXECUTIONS_MARK, 50)
    assert check_database_went_back(app)
    engine = create_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            moved = conn.scalar(text("SELECT last_value FROM schedule_executions_id_seq"))
    finally:
        engine.dispose()
    assert moved == 50 + SEQUENCE_MARGIN


def test_a_role_that_cannot_move_sequences_pauses_repairs_once(
    app: ChordbeatCelery, settings: Settings, postgres_server: PostgresServer, roles_database: str
) -> None:
    """A deployment whose runtime role predates the grant: CRITICAL, and repairs paused for one
    TTL, not at every pass from then on (the runs' tokens keep reused ids apart meanwhile)."""
    admin = create_engine(postgres_server.url(roles_database), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text("REVOKE UPDATE ON ALL SEQUENCES IN SCHEMA public FROM chordbeat_app"))
    finally:
        admin.dispose()
    client = get_redis(settings.broker_url)
    client.hset(keys.HIGH_WATER_KEY, keys.EXECUTIONS_MARK, 50)
    assert check_database_went_back(app)
    client.delete(ROLLBACK_PAUSE_KEY)  # one TTL later
    assert not check_database_went_back(app)
