"""Both engines (the service's and the tools') send JSON parameters as
dispatcher.db.jsonb writes them: read back through PostgreSQL's ``json`` type, which
keeps the text it was given (``jsonb`` would normalise it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from sqlalchemy import JSON, bindparam, text
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.db import jsonb
from dispatcher.db.engine import create_engine, engine_for
from dispatcher.settings import Settings

pytestmark = pytest.mark.postgres

ENGINES: dict[str, Callable[[str], AsyncEngine]] = {
    "service": lambda url: create_engine(Settings(database_url=url)),
    "tools": engine_for,
}
VALUE = {"toolCallId": "tc-1", "input": {"amount": 1.5, "to": "é"}, "big": 2**64}


@pytest.fixture(params=sorted(ENGINES))
async def some_engine(
    request: pytest.FixtureRequest, database_url: str
) -> AsyncIterator[AsyncEngine]:
    engine = ENGINES[request.param](database_url)
    yield engine
    await engine.dispose()


async def test_json_parameters_are_sent_as_the_encoder_writes_them(
    some_engine: AsyncEngine,
) -> None:
    statement = text("SELECT CAST(:v AS json)::text").bindparams(bindparam("v", type_=JSON))
    async with some_engine.connect() as conn:
        sent = await conn.scalar(statement, {"v": VALUE})
    assert sent == jsonb.dumps(VALUE).decode()
