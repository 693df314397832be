"""Signing out ends the console session on the server, on every API replica: a copy of
the cookie taken before sign-out is sent to the sign-in form afterwards by a second API
process on the same database, which shares nothing with the first but the database
and the configuration. Removing a key from the configuration still ends its sessions,
and the sessions table stays bounded."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from devtools.embedded import free_port, wait_for_port
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.console.session_rows import PURGE_BATCH
from dispatcher.db.tables import console_sessions
from dispatcher.settings import ApiKey, Settings
from tests.fixtures.api import BOB, OPERATOR, control_keys, running_api
from tests.fixtures.stack import MakeStack, ProcessStack
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres

SECRET = "console-secret-shared-by-the-replicas"
PAGE = "/console/overview"
SIGN_IN_AGAIN = "/console/login?next=%2Fconsole%2Foverview"


def keys_without(removed: str | None = None) -> list[ApiKey]:
    return [k for k in control_keys() if removed is None or k.name != removed]


async def sign_in(base_url: str, key: str) -> str:
    """The session cookie's value after signing in with ``key`` on ``base_url``."""
    async with httpx.AsyncClient(base_url=base_url) as client:
        answer = await client.post("/console/login", data={"key": key, "next": PAGE})
        assert answer.status_code == 303, answer.text
        return client.cookies["td-console"]


async def opens(base_url: str, cookie: str) -> httpx.Response:
    """The overview page, asked for with ``cookie`` alone (a copy of it, as a thief has)."""
    async with httpx.AsyncClient(base_url=base_url, cookies={"td-console": cookie}) as client:
        return await client.get(PAGE)


def assert_shown(answer: httpx.Response) -> None:
    assert answer.status_code == 200, answer.headers.get("location")
    assert "Sign out" in answer.text


def assert_sent_to_sign_in(answer: httpx.Response) -> None:
    assert answer.status_code == 303, "the page was shown"
    assert answer.headers["location"] == SIGN_IN_AGAIN


async def sign_out(base_url: str, cookie: str) -> None:
    """Sign out as the browser does: the page's sign-out form, with its CSRF token."""
    async with httpx.AsyncClient(base_url=base_url, cookies={"td-console": cookie}) as client:
        page = await client.get(PAGE)
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert found is not None, page.text
        answer = await client.post("/console/logout", data={"csrf": found.group(1)})
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == "/console/login"


async def serving(stack: ProcessStack) -> str:
    """Start one more API process of ``stack``; its base URL once it answers."""
    port = free_port("127.0.0.1")
    process = stack.start("serve", http_port=str(port))
    await asyncio.to_thread(wait_for_port, "127.0.0.1", port, timeout=60)
    base_url = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        assert process.poll() is None, stack.log_of(process)
        async with httpx.AsyncClient(base_url=base_url) as client:
            return (await client.get("/readyz")).status_code == 200

    await eventually(ready, what=f"the API process on :{port} to be ready")
    return base_url


async def test_a_copied_cookie_is_refused_by_every_api_process_after_sign_out(
    make_stack: MakeStack,
) -> None:
    # Two `serve` processes on this test's database, nothing else of a stack (no broker
    # or provider is reached by a console page: their addresses are never dialled).
    stack = make_stack(
        sandbox_url="http://127.0.0.1:9",
        kafka_bootstrap="127.0.0.1:9",
        api_keys=json.dumps([k.model_dump() for k in keys_without()]),
        console_secret=SECRET,
        console_secure_cookie="false",
    )
    first, second = await serving(stack), await serving(stack)

    cookie = await sign_in(first, OPERATOR)
    other_session = await sign_in(first, OPERATOR)
    # Before sign-out the session opens the console on both processes.
    assert_shown(await opens(first, cookie))
    assert_shown(await opens(second, cookie))

    await sign_out(first, cookie)

    # The copy was never cleared from any browser: only the server can refuse it.
    assert_sent_to_sign_in(await opens(second, cookie))
    assert_sent_to_sign_in(await opens(first, cookie))
    # The same key's other session was not signed out.
    assert_shown(await opens(second, other_session))


@pytest.fixture
def registry() -> CapabilityRegistry:
    return CapabilityRegistry({})


def console_settings(settings: Settings, keys: list[ApiKey]) -> Settings:
    update: dict[str, Any] = {
        "api_keys": keys,
        "console_secret": SecretStr(SECRET),
        "console_secure_cookie": False,
    }
    return settings.model_copy(update=update)


@pytest.fixture
async def replicas(
    settings: Settings, registry: CapabilityRegistry
) -> AsyncIterator[tuple[str, str]]:
    """Two APIs on the same database, each with an engine of its own; the second is
    configured without the operator's key (removed from its configuration)."""
    every, fewer = keys_without(), keys_without("oncall")
    async with (
        running_api(console_settings(settings, every), registry) as first,
        running_api(console_settings(settings, fewer), registry) as second,
    ):
        yield first, second


async def test_removing_a_key_from_the_configuration_ends_its_sessions(
    replicas: tuple[str, str],
) -> None:
    first, second = replicas
    operator, bob = await sign_in(first, OPERATOR), await sign_in(first, BOB)
    assert_shown(await opens(first, operator))
    # The replica configured without the key refuses its live session; another key's
    # session it serves.
    assert_sent_to_sign_in(await opens(second, operator))
    assert_shown(await opens(second, bob))


async def expired_rows(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        query = select(func.count()).where(console_sessions.c.expires_at <= func.now())
        return (await conn.execute(query.select_from(console_sessions))).scalar_one()


async def test_expired_sessions_are_deleted_a_bounded_batch_at_each_sign_in_and_out(
    replicas: tuple[str, str], engine: AsyncEngine
) -> None:
    first, _ = replicas
    past = datetime.now(UTC) - timedelta(hours=1)
    stale = [
        {"session_hash": f"stale-{n}", "key_hash": "k", "expires_at": past - timedelta(seconds=n)}
        for n in range(PURGE_BATCH + 20)
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(console_sessions), stale)

    cookie = await sign_in(first, BOB)
    # One batch only, so a sign-in never waits on a large delete.
    assert await expired_rows(engine) == 20
    assert_shown(await opens(first, cookie))
    await sign_out(first, cookie)
    assert await expired_rows(engine) == 0
    async with engine.connect() as conn:
        left = await conn.execute(select(func.count()).select_from(console_sessions))
        assert left.scalar_one() == 0
