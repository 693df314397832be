"""notify() writes one notification in the caller's transaction: it exists iff the
fact it reports was committed."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import webhook_notifications
from dispatcher.errors import InternalError
from dispatcher.webhooks import notify

pytestmark = pytest.mark.postgres


async def _count(sessions: async_sessionmaker[AsyncSession]) -> int:
    async with sessions() as session:
        found = await session.scalar(select(func.count()).select_from(webhook_notifications))
        return int(found or 0)


async def test_a_notification_commits_and_rolls_back_with_its_callers_transaction(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session, session.begin():
        await notify(session, event_type="escalation.opened", tenant="acme", data={"n": 1})
    async with sessions() as session:
        await notify(session, event_type="breaker.opened", tenant=None, data={"n": 2})
        await session.rollback()
    assert await _count(sessions) == 1
    async with sessions() as session:
        row = (await session.execute(select(webhook_notifications))).one()
    assert (row.event_type, row.tenant, row.data) == ("escalation.opened", "acme", {"n": 1})


async def test_every_tenant_is_null_and_an_unknown_event_type_is_a_bug(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session, session.begin():
        await notify(session, event_type="breaker.closed", tenant="", data={})
        with pytest.raises(InternalError, match="unknown webhook event type"):
            await notify(session, event_type="escalation.open", tenant="acme", data={})
    async with sessions() as session:
        assert await session.scalar(select(webhook_notifications.c.tenant)) is None
