"""The escalation queue's promises at the service level, on real PostgreSQL: a toolCallId
is the tenant's own, so two tenants' calls with one id are escalated, acknowledged and
resolved apart; what acknowledging and resolving record; the listing's order and limit;
and what escalating clears from the call and keeps as evidence for a person."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.control.actor import Actor
from dispatcher.control.escalations import acknowledge, escalate, resolution_commands, resolve
from dispatcher.db.tables import escalations, execution_events, outbox, tool_calls
from dispatcher.errors import EscalationAlreadyResolved, EscalationNotFound
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import Producer, ce_source
from dispatcher.schemas import Finding
from dispatcher.settings import Topics
from dispatcher.states import EscalationStatus
from dispatcher.states import ExecutionStatus as S
from dispatcher.views.queues import list_escalations
from tests.fixtures.calls import insert_call

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
SHARED = "shared-1"
TOPICS = Topics(events="esc-test.events", escalations="esc-test.escalations")
ONCALL = Actor(name="oncall", tenant="acme", via="api")


async def shared_escalations(sessions: Sessions) -> dict[str, str]:
    """Each tenant's ``shared-1`` escalated; returns tenant -> escalation id."""
    opened = {}
    # A second call of acme's: a lookup by tenant alone finds two.
    await insert_call(sessions, "result_unknown", tenant="acme", tool_call_id="other-1")
    for tenant in ("acme", "globex"):
        await insert_call(sessions, "result_unknown", tenant=tenant, tool_call_id=SHARED)
        async with sessions() as session, session.begin():
            view = await escalate(
                session,
                SHARED,
                tenant=tenant,
                expected=S.RESULT_UNKNOWN,
                reason=f"{tenant}'s lookups kept failing",
                evidence={},
                producer="tool-dispatcher.reconciler",
            )
        # Its first episode, and a history of its own call's events only.
        assert (view.tenant, view.episode, len(view.evidence["history"])) == (tenant, 1, 1)
        opened[tenant] = view.escalation_id
    return opened


async def call_of(sessions: Sessions, tenant: str) -> dict[str, Any]:
    async with sessions() as session:
        row = (
            await session.execute(
                select(tool_calls).where(
                    tool_calls.c.tenant == tenant, tool_calls.c.tool_call_id == SHARED
                )
            )
        ).one()
    return dict(row._mapping)


async def events_of(sessions: Sessions, tenant: str) -> list[tuple[str, dict[str, Any]]]:
    async with sessions() as session:
        rows = await session.execute(
            select(execution_events.c.event_type, execution_events.c.payload)
            .where(
                execution_events.c.tenant == tenant,
                execution_events.c.tool_call_id == SHARED,
            )
            .order_by(execution_events.c.seq)
        )
        return [(r.event_type, r.payload) for r in rows]


async def topics_written(sessions: Sessions) -> list[str]:
    async with sessions() as session:
        rows = await session.execute(select(outbox.c.topic).order_by(outbox.c.id))
        return [r[0] for r in rows]


async def last_message(sessions: Sessions, topic: str) -> Any:
    async with sessions() as session:
        return (
            await session.execute(
                select(outbox).where(outbox.c.topic == topic).order_by(outbox.c.id.desc())
            )
        ).first()


async def test_two_tenants_one_tool_call_id_are_acknowledged_and_resolved_apart(
    sessions: Sessions,
) -> None:
    esc = await shared_escalations(sessions)

    async with sessions() as session, session.begin():
        with pytest.raises(EscalationNotFound) as missing:  # acme's, asked for as globex's
            await acknowledge(session, esc["acme"], actor=ONCALL, tenant="globex")
    assert missing.value.extra == {"escalationId": esc["acme"]}
    async with sessions() as session, session.begin():
        acked = await acknowledge(session, esc["acme"], actor=ONCALL, tenant="acme", topics=TOPICS)
    assert acked.status is EscalationStatus.ACKNOWLEDGED
    assert acked.acknowledged_by == "oncall@acme (api)"
    assert acked.acknowledged_at is not None
    acked_event = EventType.TOOL_CALL_ESCALATION_ACKNOWLEDGED.value
    assert (await events_of(sessions, "acme"))[-1] == (
        acked_event,
        {"escalationId": esc["acme"], "by": ONCALL.as_payload()},
    )
    assert all(t != acked_event for t, _ in await events_of(sessions, "globex"))
    assert (await topics_written(sessions))[-1] == TOPICS.events

    async with sessions() as session, session.begin():
        done = await resolve(
            session,
            esc["acme"],
            finding=Finding.CONFIRMED_SUCCESS,
            reason="the PSP shows acme's refund",
            actor=ONCALL,
            tenant="acme",
            topics=TOPICS,
        )
    assert (done.status, done.finding) == (EscalationStatus.RESOLVED, Finding.CONFIRMED_SUCCESS)
    assert done.resolved_by == "oncall@acme (api)"
    assert done.resolution_reason == "the PSP shows acme's refund"
    assert done.resolved_at is not None
    assert (await call_of(sessions, "acme"))["status"] == S.CONFIRMED.value
    assert (await call_of(sessions, "globex"))["status"] == S.ESCALATED.value
    acme_type, acme_payload = (await events_of(sessions, "acme"))[-1]
    assert acme_type == EventType.TOOL_CALL_CONFIRMED.value
    assert acme_payload["escalationId"] == esc["acme"]
    assert acme_payload["finding"] == "confirmed_success"
    assert (await topics_written(sessions))[-2:] == [TOPICS.events, TOPICS.escalations]
    announced = await last_message(sessions, TOPICS.escalations)
    assert announced.headers["ce_source"] == ce_source(Producer.OPERATOR)
    commands = announced.payload["evidence"]["commands"]
    assert commands == resolution_commands(esc["acme"])
    assert commands["cli"][0] == f"tool-dispatcher escalations ack {esc['acme']}"

    # globex's escalation of the same toolCallId is still its own to settle.
    async with sessions() as session, session.begin():
        await resolve(
            session,
            esc["globex"],
            finding=Finding.COMPENSATED,
            reason="globex refunded it by hand",
            actor=Actor(name="ops", tenant="globex", via="api"),
            tenant="globex",
        )
    assert (await call_of(sessions, "globex"))["status"] == S.COMPENSATED.value
    assert (await call_of(sessions, "acme"))["status"] == S.CONFIRMED.value
    assert [t for t, _ in await events_of(sessions, "globex")][
        -1
    ] == EventType.TOOL_CALL_COMPENSATED.value


async def test_a_resolved_escalation_refuses_both_actions_naming_itself_and_its_finding(
    sessions: Sessions,
) -> None:
    esc = (await shared_escalations(sessions))["globex"]
    async with sessions() as session, session.begin():
        await resolve(
            session,
            esc,
            finding=Finding.CONFIRMED_FAILURE,
            reason="no refund anywhere",
            actor=ONCALL,
            tenant="globex",
        )
    for again in (
        lambda s: acknowledge(s, esc, actor=ONCALL, tenant="globex"),
        lambda s: resolve(
            s, esc, finding=Finding.COMPENSATED, reason="x", actor=ONCALL, tenant="globex"
        ),
    ):
        async with sessions() as session, session.begin():
            with pytest.raises(EscalationAlreadyResolved) as refused:
                await again(session)
        assert refused.value.extra == {"escalationId": esc, "finding": "confirmed_failure"}
        assert esc in refused.value.detail


async def test_the_listing_is_open_then_acknowledged_then_resolved_oldest_first(
    sessions: Sessions,
) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    # Inserted out of order, so neither insertion order nor id order is the answer.
    rows = [
        ("esc_open_late", "open", 3),
        ("esc_resolved", "resolved", -1),
        ("esc_ack_late", "acknowledged", 1),
        ("esc_open_early", "open", 2),
        ("esc_ack_early", "acknowledged", 0),
    ]
    async with sessions() as session, session.begin():
        await session.execute(
            insert(escalations),
            [
                {
                    "escalation_id": eid,
                    "tool_call_id": f"tc-{eid}",
                    "tenant": "acme",
                    "episode": 1,
                    "status": status,
                    "reason": "r",
                    "evidence": {},
                    "created_at": t0 + timedelta(minutes=minutes),
                }
                for eid, status, minutes in rows
            ],
        )
    async with sessions() as session:
        listed = [v.escalation_id for v in await list_escalations(session, tenant="acme")]
        first_two = [v.escalation_id for v in await list_escalations(session, limit=2)]
    assert listed == [
        "esc_open_early",
        "esc_open_late",
        "esc_ack_early",
        "esc_ack_late",
        "esc_resolved",
    ]
    assert first_two == ["esc_open_early", "esc_open_late"]


async def test_escalating_clears_the_call_for_a_human_and_keeps_its_evidence(
    sessions: Sessions,
) -> None:
    dispatched = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    call = await insert_call(
        sessions,
        "result_unknown",
        external_request_id="ext-9",
        dispatch_attempts=2,
        reconcile_attempts=3,
        dispatched_at=dispatched,
        lease_owner="reconciler-a",
        lease_expires_at=dispatched,
        next_reconcile_at=dispatched,
        verification_status="pending",
        reconciliation_status="pending",
    )
    async with sessions() as session, session.begin():
        view = await escalate(
            session,
            call,
            tenant="acme",
            expected=S.RESULT_UNKNOWN,
            reason="three lookups failed",
            evidence={"lastAnswer": {"observation": "lookup_failed"}},
            producer="tool-dispatcher.reconciler",
            fields={"last_error": "lookup: ReadTimeout"},
        )
    row = await call_row_of(sessions, call)
    assert (row["status"], row["verification_status"], row["reconciliation_status"]) == (
        S.ESCALATED.value,
        "inconclusive",
        "escalated",
    )
    assert (row["next_reconcile_at"], row["lease_owner"], row["lease_expires_at"]) == (
        None,
        None,
        None,
    )
    assert row["last_error"] == "lookup: ReadTimeout"
    evidence = view.evidence
    assert evidence["call"] == {
        "toolCallId": call,
        "tenant": "acme",
        "runId": "run-1",
        "capabilityId": "send",
        "idempotencyKey": f"key-{call}",
        # The key the provider was given: insert_call's calls send theirs as written.
        "providerKey": f"key-{call}",
        "externalRequestId": "ext-9",
        "input": {"n": 1},
        "dispatchAttempts": 2,
        "reconcileAttempts": 3,
        "dispatchedAt": dispatched.isoformat(),
        "createdAt": row["created_at"].isoformat(),
        "compensationRequestedAt": None,
    }
    assert evidence["lastError"] == "lookup: ReadTimeout"
    assert evidence["lastAnswer"] == {"observation": "lookup_failed"}
    [escalated] = evidence["history"]
    assert escalated["eventType"] == EventType.TOOL_CALL_ESCALATED.value
    assert escalated["producer"] == "tool-dispatcher.reconciler"
    assert escalated["payload"] == {
        "from": [S.RESULT_UNKNOWN.value],
        "to": S.ESCALATED.value,
        "reason": "three lookups failed",
        "escalationId": view.escalation_id,
    }
    assert escalated["occurredAt"] is not None
    assert evidence["commands"] == resolution_commands(view.escalation_id)
    assert (view.episode, view.status, view.reason) == (
        1,
        EscalationStatus.OPEN,
        "three lookups failed",
    )
    opened = await last_message(sessions, "tool-dispatcher.escalations")
    assert opened.payload["escalationId"] == view.escalation_id
    assert opened.headers["ce_source"] == ce_source(Producer.RECONCILER)


async def call_row_of(sessions: Sessions, call: str) -> dict[str, Any]:
    async with sessions() as session:
        found = await session.execute(select(tool_calls).where(tool_calls.c.tool_call_id == call))
        return dict(found.one()._mapping)
