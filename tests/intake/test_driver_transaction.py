"""driver_transaction, intake's group-commit transaction on a pooled connection's psycopg
connection: it commits on a clean exit, leaves nothing behind on an error, and never
hands out again a connection the server dropped."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from dispatcher.db.engine import driver_transaction
from dispatcher.settings import to_sqlalchemy_url

pytestmark = pytest.mark.postgres

_WRITE = "INSERT INTO outbox (topic, key, payload, headers) VALUES ('t', %s, '{}', '{}')"


@pytest.fixture
async def one_connection(database_url: str) -> AsyncIterator[AsyncEngine]:
    """One pooled connection and no pre-ping: whatever a transaction leaves on it, the
    next one meets, and a dead connection is not weeded out at checkout."""
    engine = create_async_engine(
        to_sqlalchemy_url(database_url), pool_size=1, max_overflow=0, pool_pre_ping=False
    )
    yield engine
    await engine.dispose()


async def _keys(database_url: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute("SELECT key FROM outbox ORDER BY key")
        return [key for (key,) in await cursor.fetchall()]


async def _terminate(database_url: str, pid: int) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def test_a_clean_exit_commits_and_returns_the_connection(
    one_connection: AsyncEngine, database_url: str
) -> None:
    async with driver_transaction(one_connection) as conn:
        await conn.execute(_WRITE, ("committed",))

    assert await _keys(database_url) == ["committed"]
    assert one_connection.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_an_error_writes_nothing_and_the_next_transaction_starts_clean(
    one_connection: AsyncEngine, database_url: str
) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        async with driver_transaction(one_connection) as conn:
            await conn.execute(_WRITE, ("rolled-back",))
            await conn.execute("SELECT 1 / 0")

    # The same (only) connection, out of its aborted transaction.
    async with driver_transaction(one_connection) as conn:
        await conn.execute(_WRITE, ("next",))
    assert await _keys(database_url) == ["next"]
    assert one_connection.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_a_connection_the_server_dropped_is_not_handed_out_again(
    one_connection: AsyncEngine, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with driver_transaction(one_connection) as conn:
        cursor = await conn.execute("SELECT pg_backend_pid()")
        row = await cursor.fetchone()
        assert row is not None
        dropped = row[0]

    with caplog.at_level(logging.ERROR, logger="sqlalchemy.pool"):
        with pytest.raises(psycopg.OperationalError):
            async with driver_transaction(one_connection) as conn:
                await _terminate(database_url, dropped)
                await conn.execute(_WRITE, ("lost",))

        async with driver_transaction(one_connection) as conn:
            cursor = await conn.execute("SELECT pg_backend_pid()")
            row = await cursor.fetchone()
            await conn.execute(_WRITE, ("after",))
    assert row is not None
    assert row[0] != dropped
    assert await _keys(database_url) == ["after"]
    # Discarded as dropped, not found broken by the pool's reset (which logs an error).
    assert not [r for r in caplog.records if r.name.startswith("sqlalchemy.pool")]
