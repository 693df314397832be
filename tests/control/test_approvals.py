"""Approvals through the real HTTP API (uvicorn on loopback) and real PostgreSQL: the
first decision wins (also against 19 concurrent rivals), every refusal has its code,
and the expiry sweeper closes what nobody decided."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control import approvals
from dispatcher.control.actor import Actor
from dispatcher.db.tables import tool_calls
from dispatcher.errors import ApprovalStale, CapabilityUnavailable, Forbidden
from dispatcher.schemas import DecisionRequest
from dispatcher.settings import DEFAULT_TOPICS, Settings
from tests.fixtures.api import (
    ALICE,
    BOB,
    GLOBEX,
    OPERATOR,
    READER,
    bearer,
)
from tests.fixtures.capabilities import (
    approval_capability,
    plain_capability,
    with_capability,
    without_capability,
)
from tests.fixtures.cli import run_cli
from tests.fixtures.rows import (
    approval_of,
    call_row,
    dispatch_commands,
    event_payloads,
    event_types,
)
from tool_dispatcher.approvals import expire_all

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
def registry() -> CapabilityRegistry:
    caps = [
        approval_capability("refund-big"),
        approval_capability("refund-four-eyes", forbidSelfApproval=True),
        approval_capability("refund-short", approvalTtlSeconds=0.2),
        plain_capability("send"),
    ]
    return CapabilityRegistry({c.id: c for c in caps})


async def propose(
    api: httpx.AsyncClient, cap: str = "refund-big", key: str = ALICE, **fields: Any
) -> dict[str, Any]:
    """Submit a call that needs approval; returns (its view, its approval id)."""
    body = {"runId": "run-1", "capabilityId": cap, "input": {"orderId": "o-1"}, **fields}
    reply = await api.post("/v1/tool-calls", json=body, headers=bearer(key))
    assert reply.status_code == 201, reply.text
    view: dict[str, Any] = reply.json()
    assert view["status"] == "proposed"
    return view


async def approval_id(sessions: Sessions, tool_call_id: str) -> str:
    return str((await approval_of(sessions, tool_call_id))["approval_id"])


def decision(verdict: str = "approve", reason: str = "looks right") -> dict[str, str]:
    return {"decision": verdict, "reason": reason}


def assert_problem(reply: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = reply.json()
    assert body["code"] == code
    return body


async def test_intake_proposes_with_an_approval_and_no_command(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    call = (await propose(api))["toolCallId"]

    approval = await approval_of(sessions, call)
    assert approval["status"] == "pending" and approval["requested_by"] == "alice"
    assert approval["risk"] == "high" and approval["policy_version"] == 1
    assert await event_types(sessions, call) == ["tool.call.requested", "approval.required"]
    required = (await event_payloads(sessions, call))[1]
    assert required["approvalId"] == approval["approval_id"]
    assert required["risk"] == "high"
    assert required["expiresAt"] == approval["expires_at"].isoformat()
    assert await dispatch_commands(sessions, call) == 0

    pending = await api.get("/v1/approvals?status=pending", headers=bearer(BOB))
    assert pending.status_code == 200
    [listed] = pending.json()["approvals"]
    assert listed["approvalId"] == approval["approval_id"] and listed["toolCallId"] == call
    # Tenant-scoped, and a read scope is needed.
    other = await api.get("/v1/approvals?status=pending", headers=bearer(GLOBEX))
    assert other.json()["approvals"] == []
    assert (await api.get("/v1/approvals")).status_code == 401


async def test_approve_authorizes_queues_dispatch_and_a_second_decision_is_409(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    call = (await propose(api))["toolCallId"]
    apr = await approval_id(sessions, call)

    reply = await api.post(f"/v1/approvals/{apr}/decision", json=decision(), headers=bearer(BOB))
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "approved" and reply.json()["decidedBy"] == "bob"

    row = await call_row(sessions, call)
    assert row["status"] == "authorized"
    assert (await event_types(sessions, call))[-1] == "approval.granted"
    granted = (await event_payloads(sessions, call))[-1]
    assert granted["approvalId"] == apr and granted["by"]["name"] == "bob"
    assert await dispatch_commands(sessions, call) == 1

    for verdict in ("approve", "reject"):
        again = await api.post(
            f"/v1/approvals/{apr}/decision", json=decision(verdict), headers=bearer(ALICE)
        )
        problem = assert_problem(again, 409, "approval_already_decided")
        assert problem["decision"] == "approve" and problem["decidedBy"] == "bob"
    assert await dispatch_commands(sessions, call) == 1


async def test_reject_rejects_the_call_without_a_command(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    call = (await propose(api))["toolCallId"]
    apr = await approval_id(sessions, call)

    reply = await api.post(
        f"/v1/approvals/{apr}/decision", json=decision("reject", "too much"), headers=bearer(BOB)
    )
    assert reply.status_code == 200, reply.text
    assert (await call_row(sessions, call))["status"] == "rejected"
    assert (await event_types(sessions, call))[-1] == "approval.rejected"
    assert (await event_payloads(sessions, call))[-1]["reason"] == "too much"
    assert await dispatch_commands(sessions, call) == 0
    assert (await approval_of(sessions, call))["decision"] == "reject"


async def test_twenty_concurrent_decisions_exactly_one_wins(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    call = (await propose(api))["toolCallId"]
    apr = await approval_id(sessions, call)
    url = f"/v1/approvals/{apr}/decision"

    replies = await asyncio.gather(
        *(
            api.post(url, json=decision("approve" if i % 2 else "reject"), headers=bearer(BOB))
            for i in range(20)
        )
    )

    statuses = Counter(r.status_code for r in replies)
    assert statuses == {200: 1, 409: 19}, [r.text for r in replies]
    assert {r.json()["code"] for r in replies if r.status_code == 409} == {
        "approval_already_decided"
    }
    [winner] = [r.json() for r in replies if r.status_code == 200]
    decided = [t for t in await event_types(sessions, call) if t.startswith("approval.")]
    assert decided == [
        "approval.required",
        f"approval.{winner['status'].replace('approved', 'granted')}",
    ]
    assert await dispatch_commands(sessions, call) == (1 if winner["decision"] == "approve" else 0)


async def test_revalidation_refuses_missing_scope_and_self_approval(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    call = (await propose(api, "refund-four-eyes"))["toolCallId"]
    apr = await approval_id(sessions, call)
    url = f"/v1/approvals/{apr}/decision"

    assert_problem(await api.post(url, json=decision(), headers=bearer(READER)), 403, "forbidden")
    assert_problem(await api.post(url, json=decision(), headers=bearer(OPERATOR)), 403, "forbidden")
    assert_problem(
        await api.post(url, json=decision(), headers=bearer(ALICE)), 403, "self_approval_forbidden"
    )
    # Another tenant's approval does not exist for it.
    assert_problem(
        await api.post(url, json=decision(), headers=bearer(GLOBEX)), 404, "approval_not_found"
    )
    # Refusals consumed nothing: someone else may still approve.
    assert (await approval_of(sessions, call))["status"] == "pending"
    ok = await api.post(url, json=decision(), headers=bearer(BOB))
    assert ok.status_code == 200, ok.text


async def test_self_approval_is_allowed_unless_the_capability_forbids_it(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    call = (await propose(api, "refund-big"))["toolCallId"]
    apr = await approval_id(sessions, call)
    reply = await api.post(f"/v1/approvals/{apr}/decision", json=decision(), headers=bearer(ALICE))
    assert reply.status_code == 200, reply.text


async def test_a_stopped_run_refuses_the_approval(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    call = (await propose(api))["toolCallId"]
    apr = await approval_id(sessions, call)
    stop = await api.post("/v1/runs/run-1/stop", json={"reason": "abort"}, headers=bearer(OPERATOR))
    assert stop.status_code == 200, stop.text

    reply = await api.post(f"/v1/approvals/{apr}/decision", json=decision(), headers=bearer(BOB))
    assert_problem(reply, 409, "run_stopped")
    assert (await call_row(sessions, call))["status"] == "cancelled"
    assert await dispatch_commands(sessions, call) == 0


async def test_revalidation_refuses_a_disabled_or_missing_capability(
    sessions: Sessions, api: httpx.AsyncClient, registry: CapabilityRegistry
) -> None:
    call = (await propose(api))["toolCallId"]
    apr = await approval_id(sessions, call)
    bob = Actor("bob", "acme", "api")
    disabled = with_capability(registry, approval_capability("refund-big", enabled=False))

    for changed, why in (
        (disabled, "is disabled"),
        (without_capability(registry, "refund-big"), "no longer"),
    ):
        with pytest.raises(CapabilityUnavailable, match=why):
            async with sessions() as session, session.begin():
                await approvals.decide(
                    session, apr, DecisionRequest(decision="approve"),
                    actor=bob, scopes={"approve"}, tenant="acme", registry=changed,
                )  # fmt: skip
    with pytest.raises(Forbidden):
        async with sessions() as session, session.begin():
            await approvals.decide(
                session, apr, DecisionRequest(decision="approve"),
                actor=bob, scopes={"read"}, tenant="acme", registry=registry,
            )  # fmt: skip
    assert (await call_row(sessions, call))["status"] == "proposed"
    assert (await approval_of(sessions, call))["status"] == "pending"


async def test_a_decision_for_a_changed_input_or_policy_is_stale(
    sessions: Sessions, api: httpx.AsyncClient, registry: CapabilityRegistry
) -> None:
    first = (await propose(api, correlationId="c-1", idempotencyKey="k-1"))["toolCallId"]
    second = (await propose(api, correlationId="c-2", idempotencyKey="k-2"))["toolCallId"]
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls)
            .where(tool_calls.c.tool_call_id == first)
            .values(input={"orderId": "o-1", "amountCents": 10_000_000})
        )
    reply = await api.post(
        f"/v1/approvals/{await approval_id(sessions, first)}/decision",
        json=decision(),
        headers=bearer(BOB),
    )
    assert assert_problem(reply, 409, "approval_stale")["changed"] == "input"

    newer = with_capability(registry, approval_capability("refund-big", policyVersion=2))
    with pytest.raises(ApprovalStale, match="policy"):
        async with sessions() as session, session.begin():
            await approvals.decide(
                session, await approval_id(sessions, second), DecisionRequest(decision="reject"),
                actor=Actor("bob", "acme", "api"), scopes={"approve"}, tenant="acme",
                registry=newer,
            )  # fmt: skip
    assert (await call_row(sessions, first))["status"] == "proposed"
    assert (await call_row(sessions, second))["status"] == "proposed"


async def test_expired_approval_is_refused_then_swept(
    sessions: Sessions, api: httpx.AsyncClient, api_settings: Settings
) -> None:
    call = (await propose(api, "refund-short"))["toolCallId"]
    apr = await approval_id(sessions, call)
    keep = (await propose(api, "refund-big", idempotencyKey="still-open"))["toolCallId"]
    await asyncio.sleep(0.3)  # past the capability's 0.2 s approval TTL
    reply = await api.post(f"/v1/approvals/{apr}/decision", json=decision(), headers=bearer(BOB))
    assert_problem(reply, 409, "approval_expired")
    assert (await call_row(sessions, call))["status"] == "proposed"  # refused, nothing written

    result = run_cli(
        "approvals",
        "expire",
        "--once",
        TOOL_DISPATCHER_DATABASE_URL=api_settings.database_url or "",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "expired: 1"

    assert (await call_row(sessions, call))["status"] == "cancelled"
    assert (await event_types(sessions, call))[-1] == "approval.expired"
    assert (await approval_of(sessions, call))["status"] == "expired"
    assert (await approval_of(sessions, keep))["status"] == "pending"
    again = await api.post(f"/v1/approvals/{apr}/decision", json=decision(), headers=bearer(BOB))
    assert_problem(again, 409, "approval_expired")
    assert await expire_all(sessions, topics=DEFAULT_TOPICS) == []
    pending = await api.get("/v1/approvals?status=pending", headers=bearer(BOB))
    assert [a["toolCallId"] for a in pending.json()["approvals"]] == [keep]


async def test_decisions_racing_a_stop_never_deadlock_and_leave_nothing_queued(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    calls = [
        (await propose(api, idempotencyKey=f"race-{i}", input={"orderId": f"o-{i}"}))["toolCallId"]
        for i in range(8)
    ]
    ids = [await approval_id(sessions, call) for call in calls]

    async def stop() -> httpx.Response:
        await asyncio.sleep(0.01)
        return await api.post("/v1/runs/run-1/stop", json={}, headers=bearer(OPERATOR))

    replies = await asyncio.gather(
        *(
            api.post(f"/v1/approvals/{apr}/decision", json=decision(), headers=bearer(BOB))
            for apr in ids
        ),
        stop(),
    )
    assert all(r.status_code in (200, 409) for r in replies), [r.text for r in replies]
    assert {r.json()["code"] for r in replies if r.status_code == 409} <= {"run_stopped"}
    # Approved before the stop (then cancelled by it) or refused after it: either way
    # nothing of the stopped run is left to dispatch.
    assert {(await call_row(sessions, call))["status"] for call in calls} == {"cancelled"}
