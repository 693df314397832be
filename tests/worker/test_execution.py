"""Each outcome class of a dispatch, against the real sandbox provider over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.embedded import free_port
from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from tests.fixtures.calls import submit_call
from tests.fixtures.rows import call_row, event_payloads, event_types, outbox_rows
from tests.fixtures.sandbox import add_fault, at_provider, books

pytestmark = pytest.mark.postgres

MakeExecutor = Callable[..., Executor]


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    unused = f"http://127.0.0.1:{free_port()}"
    return registry_of(
        capability("refund", sandbox.url),
        capability("lookup", sandbox.url, side_effects=False),
        capability("refund-slow", sandbox.url, timeout=0.3),
        capability("refund-nowhere", unused, attempts=3),
        capability("refund-patient", sandbox.url, backoff=(0.01, 0.4)),
    )


@pytest.fixture
def make_executor(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    http: Transport,
) -> MakeExecutor:
    def make(worker_id: str = "worker-a", secrets: dict[str, str] | None = None) -> Executor:
        return Executor(
            sessions,
            registry,
            ProviderClient(http, secrets),
            worker_id=worker_id,
            topics=DEFAULT_TOPICS,
        )

    return make


async def test_final_success_is_completed_straight_from_dispatching(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    make_executor: MakeExecutor,
) -> None:
    call = await submit_call(sessions, registry, "refund", {"orderId": "o-1"}, key="refund:o-1")

    assert await make_executor().execute(call, "acme") is S.COMPLETED

    row = await call_row(sessions, call)
    assert row["status"] == "completed"
    assert row["verification_status"] == "confirmed_success"
    assert row["external_request_id"].startswith("req_")
    assert row["accepted_at"] is not None and row["completed_at"] is not None
    assert row["dispatched_at"] is not None
    assert row["result"] == {"echo": {"orderId": "o-1"}}
    assert row["lease_owner"] is None
    assert await event_types(sessions, call) == [
        "tool.call.requested",
        "tool.call.authorized",
        "tool.call.dispatching",
        "tool.call.completed",
    ]
    # One event ends the claim, naming it as its dispatching event did.
    claimed, completed = (await event_payloads(sessions, call))[-2:]
    assert completed["from"] == ["dispatching"] and completed["to"] == "completed"
    assert (completed["worker"], completed["claimVersion"]) == (
        claimed["worker"],
        claimed["claimVersion"],
    )
    assert (completed["httpStatus"], completed["externalRequestId"]) == (
        200,
        row["external_request_id"],
    )
    published = [
        r["headers"]["ce_type"] for r in await outbox_rows(sessions, DEFAULT_TOPICS.events)
    ]
    # The claim's event is in the log only (LOG_ONLY): consumers get the outcome.
    assert published[-3:] == [
        "tool.call.requested",
        "tool.call.authorized",
        "tool.call.completed",
    ]
    assert (await books(sandbox.url))["effects"] == {at_provider("refund:o-1"): 1}


async def test_provider_reported_failure_is_failed_and_confirmed(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    make_executor: MakeExecutor,
) -> None:
    call = await submit_call(sessions, registry, "refund", {"simulate": "fail"}, key="k-fail")
    assert await make_executor().execute(call, "acme") is S.FAILED
    row = await call_row(sessions, call)
    assert row["verification_status"] == "confirmed_failure"
    assert "failure" in row["last_error"]
    assert (await books(sandbox.url))["effects"] == {}


async def test_pending_is_accepted_and_left_to_the_reconciler(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    make_executor: MakeExecutor,
) -> None:
    call = await submit_call(sessions, registry, "refund", {"simulate": "pending"}, key="k-p")
    assert await make_executor().execute(call, "acme") is S.ACCEPTED
    row = await call_row(sessions, call)
    assert row["reconciliation_status"] == "pending"
    assert row["verification_status"] == "pending"
    assert row["next_reconcile_at"] is not None
    assert row["external_request_id"] is not None
    assert row["completed_at"] is None


async def test_invalid_request_fails_without_retry(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    make_executor: MakeExecutor,
) -> None:
    call = await submit_call(sessions, registry, "refund", {"simulate": "invalid"}, key="k-bad")
    assert await make_executor().execute(call, "acme") is S.FAILED
    row = await call_row(sessions, call)
    assert "HTTP 400" in row["last_error"]
    assert (await books(sandbox.url))["received"] == {at_provider("k-bad"): 1}


async def test_connection_refused_is_retried_then_failed_as_not_sent(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    make_executor: MakeExecutor,
) -> None:
    call = await submit_call(sessions, registry, "refund-nowhere", {}, key="k-nowhere")
    assert await make_executor().execute(call, "acme") is S.FAILED
    row = await call_row(sessions, call)
    assert row["verification_status"] == "not_observed"
    assert row["last_error"] == "not sent: ClientConnectorError"
    assert (await event_payloads(sessions, call))[-1]["attempts"] == 3


@pytest.mark.parametrize("kind", ["rate_limit", "unavailable"])
async def test_throttling_is_retried_with_the_same_key(
    kind: str,
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    make_executor: MakeExecutor,
) -> None:
    await add_fault(
        sandbox.url,
        {"kind": kind, "idempotencyKey": at_provider("k-thr"), "times": 2, "retryAfter": 0},
    )
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="k-thr")
    assert await make_executor().execute(call, "acme") is S.COMPLETED
    counts = await books(sandbox.url)
    assert counts["received"] == {at_provider("k-thr"): 3}
    assert counts["effects"] == {at_provider("k-thr"): 1}


async def test_the_first_retry_waits_the_providers_retry_after(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    make_executor: MakeExecutor,
) -> None:
    """The first attempt's answer sets the first wait: Retry-After 1 s, capped by the
    policy's 0.4 s, where its own backoff would be at most 10 ms."""
    await add_fault(
        sandbox.url,
        {
            "kind": "rate_limit",
            "idempotencyKey": at_provider("k-wait"),
            "times": 1,
            "retryAfter": 1,
        },
    )
    call = await submit_call(sessions, registry, "refund-patient", {"n": 1}, key="k-wait")
    started = time.monotonic()
    assert await make_executor().execute(call, "acme") is S.COMPLETED
    assert time.monotonic() - started >= 0.4
    assert (await books(sandbox.url))["received"] == {at_provider("k-wait"): 2}


@pytest.mark.parametrize(
    ("cap", "rule"),
    [
        ("refund-slow", {"kind": "timeout", "seconds": 2, "apply": True}),
        ("refund", {"kind": "drop_after_apply"}),
        ("refund", {"kind": "drop_after_apply", "reset": True}),
        ("refund", {"kind": "error", "status": 500}),
        ("refund", {"kind": "error", "status": 503}),
    ],
    ids=["read-timeout", "dropped-response", "connection-reset", "http-500", "503-no-retry-after"],
)
async def test_sent_without_a_definitive_answer_is_result_unknown_never_retried(
    cap: str,
    rule: dict[str, Any],
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    make_executor: MakeExecutor,
) -> None:
    await add_fault(sandbox.url, {**rule, "idempotencyKey": at_provider("k-unk")})
    call = await submit_call(sessions, registry, cap, {"n": 1}, key="k-unk")

    assert await make_executor().execute(call, "acme") is S.RESULT_UNKNOWN

    row = await call_row(sessions, call)
    assert row["reconciliation_status"] == "pending"
    assert row["verification_status"] == "pending"
    assert row["next_reconcile_at"] is not None
    assert row["last_error"]
    assert (await books(sandbox.url))["received"] == {at_provider("k-unk"): 1}


async def test_read_only_capability_is_simply_retried_on_a_lost_response(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    make_executor: MakeExecutor,
) -> None:
    await add_fault(
        sandbox.url, {"kind": "drop_after_apply", "idempotencyKey": at_provider("k-ro"), "times": 1}
    )
    call = await submit_call(sessions, registry, "lookup", {"orderId": "o-9"}, key="k-ro")
    assert await make_executor().execute(call, "acme") is S.COMPLETED
    assert (await books(sandbox.url))["received"] == {at_provider("k-ro"): 2}


async def test_a_duplicate_command_is_dropped_by_the_call_state(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    make_executor: MakeExecutor,
) -> None:
    call = await submit_call(sessions, registry, "refund", {"n": 2}, key="k-dup")
    executor = make_executor()
    assert await executor.execute(call, "acme") is S.COMPLETED
    assert await executor.execute(call, "acme") is None
    assert await make_executor("worker-b").execute(call, "acme") is None
    assert (await books(sandbox.url))["received"] == {at_provider("k-dup"): 1}
