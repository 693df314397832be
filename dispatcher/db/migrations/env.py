"""Alembic environment: runs on a synchronous psycopg connection handed in by
:mod:`dispatcher.db.migrate` (migrations are a one-off admin step, not a hot path)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from dispatcher.db.tables import metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no sqlalchemy.url given to the migrations")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
