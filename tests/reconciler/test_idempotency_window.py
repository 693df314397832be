"""The provider's idempotency window, counted from the FIRST send of a key: re-sends
keep ``dispatchedAt``, and past the window nothing is sent again, whichever way the
provider was asked (by key, or by its own id)."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from sqlalchemy import func
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.provider.transport import Transport
from tests.fixtures.calls import age_calls, insert_call, make_due, shift_clock, unknown_call
from tests.fixtures.capabilities import reconcile_capability
from tests.fixtures.reconciling import new_reconciler
from tests.fixtures.rows import call_row, escalation_rows, event_types
from tests.fixtures.sandbox import add_fault, at_provider, books

pytestmark = pytest.mark.postgres

WINDOW = 60.0


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    window = {"idempotencyWindowSeconds": WINDOW, "maxRedispatches": 5}
    return registry_of(
        reconcile_capability("refund", sandbox.url, reconcile=window),
        reconcile_capability(
            "refund-retry-failed", sandbox.url, reconcile={**window, "onFailed": "redispatch"}
        ),
    )


async def test_the_window_counts_from_the_first_send_not_the_last_resend(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    # The first send and the next two re-sends never reach the provider.
    await add_fault(
        sandbox.url,
        {
            "kind": "drop_before_apply",
            "method": "POST",
            "idempotencyKey": at_provider("k-w"),
            "times": 2,
        },
    )
    call = await unknown_call(
        sessions, registry, http, sandbox.url, "refund", "k-w", {"kind": "drop_before_apply"}
    )
    await shift_clock(sessions, 40)
    first_send = (await call_row(sessions, call))["dispatched_at"]
    reconciler = new_reconciler(sessions, registry, http)
    for resend in (1, 2):
        assert (await reconciler.run_pass()).counts == {"redispatched": 1}
        row = await call_row(sessions, call)
        assert (row["status"], row["dispatch_attempts"]) == ("result_unknown", 1 + resend)
        assert row["dispatched_at"] == first_send
        await make_due(sessions)
    # First sent 65 s ago (past the window), last re-sent 25 s ago.
    await shift_clock(sessions, 25)
    before = await books(sandbox.url)

    assert (await reconciler.run_pass()).counts == {"escalated": 1}

    assert await books(sandbox.url) == before  # no re-send, not even a lookup by key
    row = await call_row(sessions, call)
    assert (row["status"], row["dispatch_attempts"]) == ("escalated", 3)
    [record] = await escalation_rows(sessions)
    # The first send's time (moved back by the clock shift), not a re-send's.
    dispatched = first_send - timedelta(seconds=25)
    assert record["evidence"]["call"]["dispatchedAt"] == dispatched.isoformat()


async def provider_failed_request(sandbox_url: str, key: str) -> str:
    """A request the provider took and failed; returns its externalRequestId."""
    async with httpx.AsyncClient(base_url=sandbox_url) as client:
        reply = await client.post(
            "/v1/requests", json={"simulate": "fail"}, headers={"Idempotency-Key": key}
        )
    external_id: str = reply.json()["externalRequestId"]
    return external_id


async def unknown_with_provider_id(
    sessions: async_sessionmaker[AsyncSession], sandbox_url: str, key: str
) -> str:
    """A call in doubt whose provider id is known (its answer named it, or an earlier
    re-send did) and which the provider failed; due now."""
    return await insert_call(
        sessions,
        "result_unknown",
        cap_id="refund-retry-failed",
        input={"simulate": "fail"},
        idempotency_key=key,
        external_request_id=await provider_failed_request(sandbox_url, key),
        verification_status="pending",
        reconciliation_status="pending",
        dispatch_attempts=1,
        dispatched_at=func.now(),
        next_reconcile_at=func.now(),
        last_error="no definitive answer: HTTP 500",
    )


async def test_a_failed_call_known_by_id_is_resent_inside_the_window(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await unknown_with_provider_id(sessions, sandbox.url, "k-id-new")

    assert (await new_reconciler(sessions, registry, http).run_pass()).counts == {"redispatched": 1}

    assert "tool.call.redispatched" in await event_types(sessions, call)
    assert (await call_row(sessions, call))["dispatch_attempts"] == 2


async def test_a_failed_call_known_by_id_is_not_resent_past_the_window(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    """onFailed = "redispatch", the lookup by the provider's id answers ``failed``, and
    the key was first sent two minutes ago (the window is one): escalated, not re-sent."""
    call = await unknown_with_provider_id(sessions, sandbox.url, "k-id-old")
    await age_calls(sessions, 120)
    before = (await books(sandbox.url))["received"]

    assert (await new_reconciler(sessions, registry, http).run_pass()).counts == {"escalated": 1}

    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"]) == ("escalated", "inconclusive")
    assert row["dispatch_attempts"] == 1
    assert "tool.call.redispatched" not in await event_types(sessions, call)
    assert (await books(sandbox.url))["received"] == before  # no POST with the key
    [record] = await escalation_rows(sessions)
    assert record["evidence"]["lastAnswer"]["via"] == "externalRequestId"
    assert record["evidence"]["lastAnswer"]["observation"] == "failed"
    assert "idempotency window has passed" in record["reason"]
