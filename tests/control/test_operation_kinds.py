"""The other kinds of bulk operation, through the API and the processor: resolving
escalated calls by a finding settles each call and its escalation as the single
resolve does (a call with no escalation to settle is refused, and counted so), and
cancelling queued calls cancels each one and closes its pending approval, its run
left running; every event is caused by the operation. Dead letters are retried or
discarded by the same means, each in its own tenant."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import approvals, escalations, execution_events, outbox, runs
from dispatcher.operations.processor import step
from tests.control.test_dead_letters_api import outbox_row
from tests.control.test_operations_api import processor
from tests.fixtures.api import OPERATOR, bearer
from tests.fixtures.operations import failed_calls, statuses, touched_rows

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]


async def events(sessions: Sessions, event_type: str) -> list[dict[str, Any]]:
    e = execution_events.c
    async with sessions() as session:
        rows = await session.execute(
            select(e.tool_call_id, e.causation_id, e.payload).where(e.event_type == event_type)
        )
        return [dict(r._mapping) for r in rows]


async def run(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry, **body: Any
) -> dict[str, Any]:
    made = await api.post("/v1/operations", json=body, headers=bearer(OPERATOR))
    assert made.status_code == 201, made.text
    await step(processor(sessions, registry), asyncio.Event())
    shown = await api.get(f"/v1/operations/{made.json()['operationId']}", headers=bearer(OPERATOR))
    return dict(shown.json())


async def test_resolving_escalated_calls_settles_each_one_and_its_escalation(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    ids = ["e1", "e2", "e3"]
    await failed_calls(sessions, [*ids, "lonely"], status="escalated")
    async with sessions() as session, session.begin():
        await session.execute(
            insert(escalations),
            [
                {"escalation_id": f"esc-{i}", "tool_call_id": i, "tenant": "acme", "episode": 1,
                 "reason": "no answer", "evidence": {}}
                for i in ids
            ],
        )  # fmt: skip
    op = await run(
        api,
        sessions,
        registry,
        kind="resolve",
        reason="checked at the bank",
        finding="confirmed_failure",
    )
    assert (op["state"], op["total"], op["done"], op["failed"]) == ("completed", 4, 3, 1)
    assert await statuses(sessions, "acme") == {
        **dict.fromkeys(ids, "confirmed"),
        "lonely": "escalated",
    }
    refused = [
        t for t in await touched_rows(sessions, op["operationId"]) if t["outcome"] == "refused"
    ]
    assert [(t["tool_call_id"], t["code"]) for t in refused] == [("lonely", "escalation_not_found")]
    async with sessions() as session:
        found = await session.execute(select(escalations.c.status, escalations.c.finding))
        assert set(found.all()) == {("resolved", "confirmed_failure")}
    confirmed = await events(sessions, "tool.call.confirmed")
    assert sorted(e["tool_call_id"] for e in confirmed) == ids
    assert {e["causation_id"] for e in confirmed} == {op["operationId"]}
    assert {e["payload"]["finding"] for e in confirmed} == {"confirmed_failure"}


async def test_cancelling_queued_calls_closes_their_approvals_and_leaves_the_run(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    await failed_calls(sessions, ["a1", "a2"], status="authorized", last_error="")
    await failed_calls(sessions, ["p1"], status="proposed", last_error="")
    await failed_calls(sessions, ["busy"], status="dispatching", last_error="")
    async with sessions() as session, session.begin():
        await session.execute(
            insert(approvals).values(
                approval_id="apr-p1", tool_call_id="p1", tenant="acme", run_id="run-1",
                capability_id="send", risk="high", input_hash="h", policy_version=1,
                expires_at=func.now() + timedelta(hours=1),
            )
        )  # fmt: skip
    op = await run(api, sessions, registry, kind="cancel", reason="the agent went rogue")
    assert (op["state"], op["total"], op["done"], op["failed"]) == ("completed", 3, 3, 0)
    assert await statuses(sessions, "acme") == {
        "a1": "cancelled", "a2": "cancelled", "p1": "cancelled", "busy": "dispatching",
    }  # fmt: skip
    async with sessions() as session:
        approval = (await session.execute(select(approvals.c.status, approvals.c.closed_at))).one()
        assert approval.status == "cancelled" and approval.closed_at is not None
        assert (await session.execute(select(runs))).all() == []
    cancelled = await events(sessions, "tool.call.cancelled")
    assert sorted(e["tool_call_id"] for e in cancelled) == ["a1", "a2", "p1"]
    assert {e["causation_id"] for e in cancelled} == {op["operationId"]}
    assert {e["payload"]["by"]["name"] for e in cancelled} == {"oncall"}


async def test_dead_letters_are_retried_or_discarded_by_filter_in_their_tenant(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    too_big = [await outbox_row(sessions, "acme", f"k{i}", dead=True) for i in range(3)]
    refused = await outbox_row(sessions, "acme", "kr", dead=True, last_error="broker refused")
    theirs = await outbox_row(sessions, "globex", "k0", dead=True)
    live = await outbox_row(sessions, "acme", "kl")
    op = await run(
        api, sessions, registry, kind="retry_dead_letters", reason="limit raised",
        filter={"lastError": "message too large"},
    )  # fmt: skip
    assert (op["state"], op["total"], op["done"]) == ("completed", 3, 3)
    async with sessions() as session:
        dead = await session.execute(
            select(outbox.c.id).where(outbox.c.dead_lettered_at.is_not(None))
        )
        assert sorted(dead.scalars()) == sorted([refused, theirs])
    touched = await touched_rows(sessions, op["operationId"])
    assert sorted(t["tool_call_id"] for t in touched) == sorted(str(i) for i in too_big)
    dropped = await run(api, sessions, registry, kind="discard_dead_letters", reason="obsolete")
    assert (dropped["total"], dropped["done"]) == (1, 1)
    async with sessions() as session:
        left = await session.execute(
            select(outbox.c.id).where(outbox.c.id.in_([refused, theirs, live]))
        )
        assert sorted(left.scalars()) == sorted([theirs, live])
    wrong = await api.post(
        "/v1/operations",
        json={"kind": "discard_dead_letters", "reason": "r", "filter": {"capabilityId": "send"}},
        headers=bearer(OPERATOR),
    )
    assert (wrong.status_code, wrong.json()["code"]) == (400, "validation_failed")
