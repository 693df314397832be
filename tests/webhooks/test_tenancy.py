"""A tenant's subscription receives its own tenant's notifications and the ones that
concern every tenant, never another tenant's, however their ids collide."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import webhook_deliveries
from dispatcher.webhooks import notify
from tests.fixtures.waiting import eventually
from tests.webhooks.conftest import sending, webhook_settings
from tests.webhooks.receiver import Receiver, new_secret

pytestmark = pytest.mark.postgres

EVENTS = ["escalation.opened", "approval.pending", "breaker.opened"]


async def test_two_tenants_with_colliding_ids_each_get_their_own_and_the_shared_ones(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async with Receiver(new_secret()) as acme, Receiver(new_secret()) as globex:
        subs = [
            {"id": "ops", "tenant": "acme", "url": acme.url, "events": EVENTS},
            {"id": "ops-2", "tenant": "globex", "url": globex.url, "events": EVENTS},
        ]
        settings = webhook_settings(
            database_url, subs, {"ops": acme.secret, "ops-2": globex.secret}
        )
        async with sessions() as session, session.begin():
            for tenant in ("acme", "globex"):
                # The same ids in both tenants: only the tenant tells them apart.
                await notify(
                    session,
                    event_type="escalation.opened",
                    tenant=tenant,
                    data={"escalationId": "esc_1", "toolCallId": "x", "who": tenant},
                )
            await notify(
                session,
                event_type="approval.pending",
                tenant="globex",
                data={"approvalId": "apr_1", "toolCallId": "x", "who": "globex"},
            )
            # A capability-wide breaker concerns every tenant.
            await notify(session, event_type="breaker.opened", tenant=None, data={"c": "refund"})
            # A tenant nobody here subscribes for is nobody's business here.
            await notify(
                session, event_type="escalation.opened", tenant="initech", data={"who": "initech"}
            )
        async with sending(settings):

            async def both() -> bool:
                return len(acme.accepted) >= 2 and len(globex.accepted) >= 3

            await eventually(both, what="both tenants' deliveries")
    # Each receiver verified its deliveries with its own tenant's secret (none refused).
    assert acme.refused == [] and globex.refused == []
    assert sorted(_seen(acme)) == [("breaker.opened", None), ("escalation.opened", "acme")]
    assert sorted(_seen(globex)) == [
        ("approval.pending", "globex"),
        ("breaker.opened", None),
        ("escalation.opened", "globex"),
    ]
    for received in acme.accepted + globex.accepted:
        assert received.payload["tenant"] in (None, received.payload["data"].get("who"))
    # Each delivery has its own webhook-id, even of one shared notification.
    assert not acme.ids() & globex.ids()
    # Nothing else was fanned out to anyone (no delivery left unsent).
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(webhook_deliveries)) == 0


def _seen(receiver: Receiver) -> list[tuple[str, str | None]]:
    return [(r.payload["type"], r.payload["data"].get("who")) for r in receiver.accepted]
