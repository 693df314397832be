"""Deliveries reach real receivers that verify them with ``standardwebhooks``: signed,
at least once through an outage with the same ``webhook-id`` on every attempt, dead
after the configured attempts, and a tampered body does not verify."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import webhook_deliveries
from dispatcher.webhooks import notify
from tests.fixtures.waiting import eventually
from tests.webhooks.conftest import sending, webhook_settings
from tests.webhooks.receiver import Receiver, new_secret

pytestmark = pytest.mark.postgres


def _sub(sub_id: str, tenant: str, url: str, *events: str) -> dict[str, object]:
    return {"id": sub_id, "tenant": tenant, "url": url, "events": list(events)}


async def _notify(
    sessions: async_sessionmaker[AsyncSession], event_type: str, tenant: str | None, **data: object
) -> None:
    async with sessions() as session, session.begin():
        await notify(session, event_type=event_type, tenant=tenant, data=data)


async def _deliveries(sessions: async_sessionmaker[AsyncSession]) -> list[tuple[str, str, int]]:
    async with sessions() as session:
        rows = await session.execute(
            select(
                webhook_deliveries.c.delivery_id,
                webhook_deliveries.c.status,
                webhook_deliveries.c.attempts,
            )
        )
        return [(r.delivery_id, r.status, r.attempts) for r in rows.all()]


async def test_a_delivery_verifies_with_the_subscriptions_secret_and_says_what_happened(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    secret = new_secret()
    async with Receiver(secret) as receiver:
        subs = [_sub("acme-ops", "acme", receiver.url, "escalation.opened")]
        settings = webhook_settings(database_url, subs, {"acme-ops": secret})
        await _notify(sessions, "escalation.opened", "acme", escalationId="esc_1", toolCallId="x")
        async with sending(settings):
            await eventually(lambda: _true(receiver.accepted), what="a delivery")
    [got] = receiver.accepted
    assert receiver.refused == []
    assert got.webhook_id.startswith("msg_")
    assert got.payload["type"] == "escalation.opened"
    assert got.payload["tenant"] == "acme"
    assert got.payload["data"] == {"escalationId": "esc_1", "toolCallId": "x"}
    # Delivered deliveries leave the table: it holds the live set and the dead.
    assert await _deliveries(sessions) == []


async def test_a_tampered_body_or_another_secret_fails_verification_in_the_receiver(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    secret = new_secret()
    async with Receiver(secret) as receiver:
        subs = [_sub("acme-ops", "acme", receiver.url, "breaker.opened")]
        settings = webhook_settings(database_url, subs, {"acme-ops": secret})
        await _notify(sessions, "breaker.opened", None, capabilityId="refund")
        async with sending(settings):
            await eventually(lambda: _true(receiver.accepted), what="a delivery")
        [got] = receiver.accepted
        tampered = got.raw.replace(b'"refund"', b'"refunx"')
        assert tampered != got.raw
        # The signed headers as sent, but the length: the client sets it for each body.
        signed = {k: v for k, v in got.headers.items() if k.lower() != "content-length"}
        async with aiohttp.ClientSession() as http:
            for body in (tampered, got.raw + b" "):
                async with http.post(receiver.url, data=body, headers=signed) as response:
                    assert response.status == 400
            # The genuine body with its headers still verifies (the test's own control).
            async with http.post(receiver.url, data=got.raw, headers=signed) as response:
                assert response.status == 204
    assert receiver.refused == [tampered, got.raw + b" "]


async def test_a_receiver_down_then_failing_gets_every_notification_under_stable_ids(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The outage, scaled: connections refused for a few seconds, then 503s until every
    delivery was seen once, then 2xx. Every notification arrives, each under the id it
    had on its failed attempts. (The 30 s variant is the same with more retries.)"""
    secret = new_secret()
    async with Receiver(secret) as receiver:
        await receiver.down()
        subs = [_sub("acme-ops", "acme", receiver.url, "dead_letter.written")]
        settings = webhook_settings(database_url, subs, {"acme-ops": secret}, max_attempts=1000)
        for n in range(5):
            await _notify(sessions, "dead_letter.written", "acme", outboxId=n)
        async with sending(settings):

            async def failed_twice() -> bool:
                return any(attempts >= 2 for _, _, attempts in await _deliveries(sessions))

            await eventually(failed_twice, what="attempts against a closed port")
            ids = {d for d, _, _ in await _deliveries(sessions)}
            assert len(ids) == 5
            receiver.answer = 503
            await receiver.up()
            await eventually(lambda: _true(set(receiver.seen) == ids), what="each id refused")
            receiver.answer = 0
            await eventually(lambda: _true(receiver.ids() == ids), what="every delivery")
    assert sorted(r.payload["data"]["outboxId"] for r in receiver.accepted) == list(range(5))
    assert set(receiver.seen) == ids
    assert await _deliveries(sessions) == []


async def test_a_delivery_is_dead_after_its_attempts_and_sent_no_more(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async with Receiver(new_secret()) as receiver:
        receiver.answer = 500
        subs = [_sub("acme-ops", "acme", receiver.url, "operation.finished")]
        settings = webhook_settings(
            database_url, subs, {"acme-ops": receiver.secret}, max_attempts=3
        )
        await _notify(sessions, "operation.finished", "acme", operationId="op_1")
        async with sending(settings):

            async def dead() -> bool:
                return [s for _, s, _ in await _deliveries(sessions)] == ["dead"]

            await eventually(dead, what="a dead delivery")
    [(delivery_id, _, attempts)] = await _deliveries(sessions)
    assert attempts == 3
    assert receiver.seen == [delivery_id] * 3


async def test_a_slow_receiver_does_not_hold_up_another_subscriptions_deliveries(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """A slow receiver with a backlog far larger than the sender's slots holds its own
    share of them only: another subscription's deliveries, written after the backlog,
    still go out while the slow receiver sits on its POSTs."""
    async with Receiver(new_secret()) as slow, Receiver(new_secret()) as quick:
        slow.hold = asyncio.Event()
        subs = [
            _sub("slow", "acme", slow.url, "approval.pending", "approval.expiring"),
            _sub("quick", "acme", quick.url, "approval.pending"),
        ]
        secrets = {"slow": slow.secret, "quick": quick.secret}
        settings = webhook_settings(
            database_url,
            subs,
            secrets,
            timeout_seconds=120.0,
            lease_seconds=180.0,
            concurrency=8,
            per_subscription=4,
        )
        for n in range(40):
            await _notify(sessions, "approval.expiring", "acme", approvalId=f"apr_old_{n}")
        async with sending(settings):
            # The slow receiver holds its POSTs until the quick one has every delivery.
            await eventually(lambda: _true(len(slow.seen) == 4), what="the slow one's share")
            # Written after the backlog: every due slow delivery is older than these.
            for n in range(3):
                await _notify(sessions, "approval.pending", "acme", approvalId=f"apr_{n}")
            await eventually(lambda: _true(len(quick.accepted) == 3), what="the quick receiver")
            assert slow.accepted == [] and len(slow.seen) == 4
            slow.hold.set()
            await eventually(lambda: _true(len(slow.accepted) == 43), what="the slow receiver")


async def _true(value: object) -> bool:
    return bool(value)


async def test_deliveries_of_a_removed_subscription_are_dead_not_stuck(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async with Receiver(new_secret()) as receiver:
        before = [_sub("old", "acme", receiver.url, "breaker.closed")]
        receiver.answer = 503
        await _notify(sessions, "breaker.closed", None, capabilityId="refund")
        async with sending(webhook_settings(database_url, before, {"old": receiver.secret})):
            await eventually(lambda: _true(receiver.seen), what="an attempt")
        # Restarted without it: nobody would ever claim its pending delivery again.
        after = [_sub("new", "acme", receiver.url, "breaker.closed")]
        async with sending(webhook_settings(database_url, after, {"new": receiver.secret})):
            pass
    [(_, status, _)] = await _deliveries(sessions)
    assert status == "dead"
