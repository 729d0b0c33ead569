"""Alembic environment: migrations run against the URL the caller put in the config."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from models.base import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")
assert url, "sqlalchemy.url must be set"
connectable = config.attributes.get("connection")


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=True,  # SQLite can only ALTER through table copies
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if connectable is None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()
else:
    _run(connectable)
