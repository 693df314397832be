from __future__ import annotations

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, pool

from dispatcher.db import migrate
from dispatcher.db.tables import metadata
from dispatcher.settings import to_sqlalchemy_url

pytestmark = pytest.mark.postgres


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    return {r[0] for r in rows}


def test_upgrade_from_empty_then_downgrade_to_base(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    assert {"tool_calls", "outbox", "execution_events", "alembic_version"} <= _tables(
        empty_database_url
    )
    migrate.downgrade(empty_database_url)
    assert _tables(empty_database_url) <= {"alembic_version"}
    migrate.upgrade(empty_database_url)  # and back up again, cleanly
    assert "tool_calls" in _tables(empty_database_url)


def test_models_and_migrations_agree(database_url: str) -> None:
    engine = create_engine(to_sqlalchemy_url(database_url), poolclass=pool.NullPool)
    with engine.connect() as conn:
        diff = compare_metadata(
            MigrationContext.configure(conn, opts={"compare_type": True}), metadata
        )
    engine.dispose()
    assert diff == []
