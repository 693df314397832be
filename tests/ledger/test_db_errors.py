"""The one classifier of database errors, fed real exceptions raised by the real
PostgreSQL server, the driver and the pool."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from sqlalchemy import exc as sa
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from devtools.embedded import free_port
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.db.tables import tool_calls
from dispatcher.settings import to_sqlalchemy_url

pytestmark = pytest.mark.postgres


async def _raised(engine: AsyncEngine, *statements: str) -> BaseException:
    # Whatever SQLAlchemy raises, as it reaches the code that classifies it.
    with pytest.raises(Exception) as info:
        async with engine.connect() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    return info.value


@pytest.mark.parametrize(
    ("statements", "kind"),
    [
        pytest.param(["SELECT 1/0"], DbErrorClass.DATA, id="division-by-zero-22012"),
        pytest.param(["SELECT 'x'::int"], DbErrorClass.DATA, id="bad-text-22P02"),
        pytest.param(
            [f"INSERT INTO {tool_calls.name} (tool_call_id) VALUES ('tc-1')"],
            DbErrorClass.CONSTRAINT,
            id="not-null-23502",
        ),
        pytest.param(
            ["SELECT array_fill(1, ARRAY[1000000000])"],
            DbErrorClass.PROGRAM_LIMIT,
            id="array-too-large-54000",
        ),
        pytest.param(
            ["SET statement_timeout = '10ms'", "SELECT pg_sleep(1)"],
            DbErrorClass.TRANSIENT,
            id="statement-timeout-57014",
        ),
        pytest.param(["SELECT * FROM nowhere"], DbErrorClass.OTHER, id="undefined-table-42P01"),
        pytest.param(["SELEC 1"], DbErrorClass.OTHER, id="syntax-42601"),
    ],
)
async def test_errors_of_a_statement(
    engine: AsyncEngine, statements: list[str], kind: DbErrorClass
) -> None:
    raised = await _raised(engine, *statements)

    assert isinstance(raised, DBAPIError)
    assert classify(raised) is kind


async def test_a_lost_serialization_race_is_contention(engine: AsyncEngine) -> None:
    async with engine.connect() as setup:
        await setup.execute(text("CREATE TABLE counter (n int)"))
        await setup.execute(text("INSERT INTO counter VALUES (0)"))
        await setup.commit()
    async with engine.connect() as loser:
        await loser.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        await loser.execute(text("SELECT n FROM counter"))  # takes the snapshot
        async with engine.connect() as winner:
            await winner.execute(text("UPDATE counter SET n = n + 1"))
            await winner.commit()
        with pytest.raises(DBAPIError) as info:
            await loser.execute(text("UPDATE counter SET n = n + 1"))

    assert getattr(info.value.orig, "sqlstate", None) == "40001"
    assert classify(info.value) is DbErrorClass.CONTENTION


async def test_a_terminated_backend_is_unavailable(engine: AsyncEngine) -> None:
    with pytest.raises(DBAPIError) as info:
        async with engine.connect() as victim:
            pid = (await victim.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            async with engine.connect() as admin:
                await admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            await victim.execute(text("SELECT 1"))

    assert classify(info.value) is DbErrorClass.UNAVAILABLE


async def test_a_refused_connection_is_unavailable() -> None:
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/none"
    engine = create_async_engine(to_sqlalchemy_url(closed))
    try:
        with pytest.raises(DBAPIError) as info:
            async with engine.connect():
                pass
    finally:
        await engine.dispose()

    assert getattr(info.value.orig, "sqlstate", None) is None
    assert classify(info.value) is DbErrorClass.UNAVAILABLE


async def test_no_pooled_connection_in_time_is_unavailable(database_url: str) -> None:
    engine = create_async_engine(
        to_sqlalchemy_url(database_url), pool_size=1, max_overflow=0, pool_timeout=0.1
    )
    try:
        async with engine.connect():
            with pytest.raises(sa.TimeoutError) as info:
                async with engine.connect():
                    pass
    finally:
        await engine.dispose()

    assert classify(info.value) is DbErrorClass.UNAVAILABLE


def test_unwrapped_driver_errors_are_classified_alike(database_url: str) -> None:
    with psycopg.connect(database_url) as conn, pytest.raises(psycopg.Error) as data:
        conn.execute("SELECT 1/0")
    # Unwrapped, nothing says the connection is gone but the server's 57P01.
    with psycopg.connect(database_url, autocommit=True) as victim:
        pid = victim.info.backend_pid
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.Error) as terminated:
            victim.execute("SELECT 1")

    assert classify(data.value) is DbErrorClass.DATA
    assert terminated.value.sqlstate == "57P01"
    assert classify(terminated.value) is DbErrorClass.UNAVAILABLE


def test_errors_that_are_not_the_database_are_other() -> None:
    # An OSError of the application's own, not of the driver or the pool.
    with pytest.raises(OSError) as info:
        Path("/nonexistent/tool-dispatcher/file").read_text()

    assert classify(info.value) is DbErrorClass.OTHER
    assert classify(ValueError("no")) is DbErrorClass.OTHER
