"""Real services for the tests: PostgreSQL (one fresh database per test, cloned from a
migrated template) and a Kafka-protocol broker (Tansu unless one is configured)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db import migrate
from dispatcher.db.engine import engine_for, session_factory
from dispatcher.settings import Settings, load_settings
from dispatcher.testing.embedded import EmbeddedPostgres, Tansu
from dispatcher.testing.registries import sandbox_registry
from dispatcher.testing.sandbox import SandboxServer
from tests.services import TestEnvironment, admin, unique_name, with_database

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def test_env() -> TestEnvironment:
    return TestEnvironment()


@pytest.fixture(scope="session")
def pg_server_url(test_env: TestEnvironment) -> Iterator[str]:
    """A libpq URL of the server's maintenance database."""
    if test_env.database_url:
        yield test_env.database_url
        return
    # A private directory, not pytest's numbered temp dirs: pytest prunes those to the
    # last few runs, which would delete the data of a server still in use by another
    # pytest session on this machine.
    home = Path(tempfile.mkdtemp(prefix="tool-dispatcher-pg-"))
    server = EmbeddedPostgres(home / "data")
    url = server.start()
    yield url
    server.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def template_database(pg_server_url: str) -> Iterator[str]:
    """A database migrated once; every test clones it."""
    name = unique_name("td_template")
    admin(pg_server_url, f'CREATE DATABASE "{name}"')
    migrate.upgrade(with_database(pg_server_url, name))
    yield name
    admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_database_url(pg_server_url: str) -> Iterator[str]:
    """A fresh database with no schema at all."""
    name = unique_name("td_empty")
    admin(pg_server_url, f'CREATE DATABASE "{name}"')
    yield with_database(pg_server_url, name)
    admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(pg_server_url: str, template_database: str) -> Iterator[str]:
    """A fresh, fully migrated database of this test's own."""
    name = unique_name("td_test")
    admin(pg_server_url, f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    yield with_database(pg_server_url, name)
    admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    eng = engine_for(database_url, pool_size=10)
    yield eng
    await eng.dispose()


@pytest.fixture(scope="session")
def kafka_bootstrap(test_env: TestEnvironment) -> Iterator[str]:
    if test_env.kafka_bootstrap:
        yield test_env.kafka_bootstrap
        return
    broker = Tansu()
    yield broker.start()
    broker.stop()


@pytest.fixture
def settings(database_url: str) -> Settings:
    return load_settings({"database_url": database_url, "kafka_enable_idempotence": False})


@pytest.fixture
def registry() -> CapabilityRegistry:
    """The packaged sandbox registry (refund-order-v2, refund-order-approved, ...)."""
    return sandbox_registry()


@pytest.fixture
def sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions on this test's own database."""
    return session_factory(engine)


@pytest.fixture
async def sandbox() -> AsyncIterator[SandboxServer]:
    """The sandbox provider, in memory, on a free port of this test's own."""
    async with SandboxServer() as server:
        yield server
