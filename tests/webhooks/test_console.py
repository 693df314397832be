"""Dead webhook deliveries in the console over plain HTTP, against the real API, the
real sender and a real receiver: a tenant sees its own only, and an operator sends one
again (same webhook-id), which a fixed receiver then takes."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import webhook_deliveries
from dispatcher.settings import Settings
from dispatcher.webhooks import notify
from tests.fixtures.api import GLOBEX, OPERATOR, control_keys
from tests.fixtures.waiting import eventually
from tests.webhooks.conftest import sending, webhook_settings
from tests.webhooks.receiver import Receiver, new_secret

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
ROW = re.compile(r'<tr data-testid="dead-delivery-row" data-delivery-id="([^"]+)">.*?</tr>', re.S)


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"api_keys": control_keys(), "console_secure_cookie": False})


async def _signed_in(api_url: str, key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api_url) as client:
        answer = await client.post("/console/login", data={"key": key, "next": "/console/"})
        assert answer.status_code == 303, answer.text
        yield client


@pytest.fixture
async def operator(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _signed_in(api_url, OPERATOR):
        yield client


@pytest.fixture
async def globex(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _signed_in(api_url, GLOBEX):
        yield client


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None
    return found.group(1)


async def _statuses(sessions: Sessions) -> list[str]:
    async with sessions() as session:
        return list(await session.scalars(select(webhook_deliveries.c.status)))


async def test_a_dead_delivery_is_listed_for_its_tenant_and_sent_again_by_an_operator(
    database_url: str,
    sessions: Sessions,
    operator: httpx.AsyncClient,
    globex: httpx.AsyncClient,
) -> None:
    async with _one_dead_delivery(database_url, sessions) as receiver:
        page = await operator.get("/console/webhooks")
        assert page.status_code == 200
        [row] = ROW.findall(page.text)
        [delivery_id] = set(receiver.seen)
        assert row == delivery_id
        assert "HTTP 500" in page.text and "breaker.opened" in page.text
        # Another tenant sees none of it, and cannot send it again.
        theirs = await globex.get("/console/webhooks")
        assert ROW.findall(theirs.text) == [] and 'data-testid="empty"' in theirs.text
        refused = await globex.post(
            f"/console/webhooks/{delivery_id}/redeliver", data={"csrf": _csrf(theirs.text)}
        )
        assert refused.status_code == 404
        assert 'data-code="webhook_delivery_not_found"' in refused.text

        receiver.answer = 0
        sent = await operator.post(
            f"/console/webhooks/{delivery_id}/redeliver", data={"csrf": _csrf(page.text)}
        )
        assert sent.status_code == 303
        await eventually(lambda: _equal(_statuses(sessions), []), what="the redelivery")
    # The same webhook-id on every attempt, the redelivery's included.
    assert [r.webhook_id for r in receiver.accepted] == [delivery_id]
    assert receiver.seen == [delivery_id] * 3


@asynccontextmanager
async def _one_dead_delivery(database_url: str, sessions: Sessions) -> AsyncIterator[Receiver]:
    """A receiver that fails, the sender running, and one delivery to it dead after its
    two attempts (acme's subscription)."""
    async with Receiver(new_secret()) as receiver:
        receiver.answer = 500
        subs = [{"id": "ops", "tenant": "acme", "url": receiver.url, "events": ["breaker.opened"]}]
        settings = webhook_settings(database_url, subs, {"ops": receiver.secret}, max_attempts=2)
        async with sessions() as session, session.begin():
            await notify(session, event_type="breaker.opened", tenant=None, data={"c": "refund"})
        async with sending(settings):
            await eventually(lambda: _equal(_statuses(sessions), ["dead"]), what="a dead delivery")
            yield receiver


async def _equal(got: Awaitable[list[str]], expected: list[str]) -> bool:
    return await got == expected


async def test_a_delivery_sent_again_that_dies_again_names_who_sent_it(
    database_url: str, sessions: Sessions, operator: httpx.AsyncClient
) -> None:
    async with _one_dead_delivery(database_url, sessions) as receiver:
        page = await operator.get("/console/webhooks")
        [delivery_id] = ROW.findall(page.text)
        assert _sent_again(page.text) == ["—"]
        sent = await operator.post(
            f"/console/webhooks/{delivery_id}/redeliver", data={"csrf": _csrf(page.text)}
        )
        assert sent.status_code == 303
        # The receiver still fails: the delivery dies again, after two more attempts.
        await eventually(lambda: _seen(receiver, 4), what="two attempts more")
        await eventually(lambda: _equal(_statuses(sessions), ["dead"]), what="dead again")
        again = await operator.get("/console/webhooks")
    [shown] = _sent_again(again.text)
    assert shown.startswith("by oncall, "), shown
    async with sessions() as session:
        row = (await session.execute(select(webhook_deliveries))).one()
    assert (row.redelivered_by, row.status, row.attempts) == ("oncall", "dead", 2)
    assert row.redelivered_at is not None


def _sent_again(html: str) -> list[str]:
    return [
        re.sub(r"<[^>]+>|\s+", " ", cell).strip()
        for cell in re.findall(r'<td data-testid="redelivered">(.*?)</td>', html, re.S)
    ]


async def _seen(receiver: Receiver, attempts: int) -> bool:
    return len(receiver.seen) >= attempts
