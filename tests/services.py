"""Where the test suite finds its real services: the ones named in the environment,
or embedded ones it starts itself."""

from __future__ import annotations

import uuid

import psycopg
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url


class TestEnvironment(BaseSettings):
    """``TOOL_DISPATCHER_TEST_DATABASE_URL`` / ``TOOL_DISPATCHER_TEST_KAFKA_BOOTSTRAP``."""

    __test__ = False
    model_config = SettingsConfigDict(env_prefix="TOOL_DISPATCHER_TEST_", extra="ignore")

    database_url: str | None = None
    kafka_bootstrap: str | None = None


def with_database(url: str, database: str) -> str:
    """The same server URL, naming another database (libpq form, no driver)."""
    parsed = make_url(url).set(drivername="postgresql", database=database)
    return parsed.render_as_string(hide_password=False)


def admin(url: str, *statements: str) -> None:
    """Run ``statements`` on the server at ``url`` outside a transaction (CREATE DATABASE)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"
