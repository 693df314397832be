"""Each fact this package hooks writes its notification in the fact's own transaction
(or, for what no caller's transaction writes, once per fact from a sweep):
escalation opened, approval pending, approval about to expire, dead letter written."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.escalations import escalate
from dispatcher.db.tables import outbox, webhook_notifications
from dispatcher.ledger.messages import Producer
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.webhooks.sweeps import report_dead_letters
from tests.fixtures.calls import insert_unknown_calls, submit_call
from tests.fixtures.capabilities import approval_capability, plain_capability
from tool_dispatcher.approvals import expire_all

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
def registry() -> CapabilityRegistry:
    caps = [
        approval_capability("refund-big", approvalTtlSeconds=600),
        plain_capability("refund-order-v2"),
    ]
    return CapabilityRegistry({c.id: c for c in caps})


async def notifications(sessions: Sessions) -> list[tuple[str, str | None, dict[str, Any]]]:
    async with sessions() as session:
        rows = await session.execute(
            select(
                webhook_notifications.c.event_type,
                webhook_notifications.c.tenant,
                webhook_notifications.c.data,
            ).order_by(webhook_notifications.c.id)
        )
        return [(r.event_type, r.tenant, r.data) for r in rows]


async def test_an_escalation_opened_is_notified_in_its_transaction(sessions: Sessions) -> None:
    [call] = await insert_unknown_calls(sessions, ["k-1"], "refund-order-v2")

    async def open_escalation() -> str:
        async with sessions() as session, session.begin():
            view = await escalate(
                session,
                call,
                tenant="acme",
                expected=S.RESULT_UNKNOWN,
                reason="lookups kept timing out",
                evidence={"lastAnswer": {"observation": "lookup_failed"}},
                producer=Producer.RECONCILER,
            )
            return view.escalation_id

    escalation_id = await open_escalation()
    [(event_type, tenant, data)] = await notifications(sessions)
    assert (event_type, tenant) == ("escalation.opened", "acme")
    assert data["escalationId"] == escalation_id and data["toolCallId"] == call
    assert data["reason"] == "lookups kept timing out"
    # The evidence (which holds the call's input) is not a receiver's.
    assert "lastAnswer" not in str(data) and "evidence" not in data


async def test_an_approval_pending_is_notified_once_with_its_call(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    call = await submit_call(sessions, registry, "refund-big", {"amount": 5}, key="k-1")
    # A replay of the same submission asks no second approval, and says nothing more.
    assert await submit_call(sessions, registry, "refund-big", {"amount": 5}, key="k-1") == call
    await submit_call(sessions, registry, "refund-order-v2", {"amount": 5}, key="k-2")
    [(event_type, tenant, data)] = await notifications(sessions)
    assert (event_type, tenant) == ("approval.pending", "acme")
    assert data["toolCallId"] == call and data["approvalId"].startswith("apr")
    assert data["capabilityId"] == "refund-big" and "expiresAt" in data
    assert "amount" not in str(data)


async def test_an_approval_about_to_expire_is_notified_once_by_the_sweeper(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    call = await submit_call(sessions, registry, "refund-big", key="k-1")
    # 600 s left: outside a 60 s warning, inside a 900 s one.
    await expire_all(sessions, topics=DEFAULT_TOPICS, expiring_within=60)
    assert [e for e, _, _ in await notifications(sessions)] == ["approval.pending"]
    for _ in range(2):
        await expire_all(sessions, topics=DEFAULT_TOPICS, expiring_within=900)
    [_, (event_type, tenant, data)] = await notifications(sessions)
    assert (event_type, tenant, data["toolCallId"]) == ("approval.expiring", "acme", call)


async def test_each_dead_letter_is_notified_once_and_again_if_it_dies_again(
    sessions: Sessions,
) -> None:
    async with sessions() as session, session.begin():
        row_id = await session.scalar(
            insert(outbox)
            .values(
                topic="tool-dispatcher.events",
                key="acme:run-1",
                payload={"tenant": "acme"},
                headers={"ce_id": "m-1"},
                attempts=3,
                dead_lettered_at=func.now(),
            )
            .returning(outbox.c.id)
        )
        # A row without a tenant is nobody's: not reported to anyone.
        await session.execute(
            insert(outbox).values(topic="t", key="k", payload={}, dead_lettered_at=func.now())
        )

    async def sweep() -> int:
        async with sessions() as session, session.begin():
            return await report_dead_letters(session)

    assert [await sweep(), await sweep()] == [1, 0]
    # Retried (dead_lettered_at cleared), then dead again: a new dead letter.
    async with sessions() as session, session.begin():
        await session.execute(
            update(outbox).where(outbox.c.id == row_id).values(dead_lettered_at=None)
        )
    async with sessions() as session, session.begin():
        await session.execute(
            update(outbox).where(outbox.c.id == row_id).values(dead_lettered_at=func.now())
        )
    assert await sweep() == 1
    found = await notifications(sessions)
    assert [(e, t) for e, t, _ in found] == [("dead_letter.written", "acme")] * 2
    assert found[0][2]["outboxId"] == row_id and found[0][2]["messageId"] == "m-1"
