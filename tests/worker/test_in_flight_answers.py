"""408 and 409 ("same key still in flight") are "sent, no definitive answer" (see
docs/provider-contract.md), driven through the real sandbox: a side-effecting call
ends ``result_unknown`` for the reconciler and no operator may retry it; a read-only
call is repeated. Any other 4xx is a refusal: ``failed``."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.actor import Actor
from dispatcher.control.retry import retry_call
from dispatcher.errors import RetryNotAllowed
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.schemas import RetryRequest
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from tests.fixtures.calls import submit_call
from tests.fixtures.rows import call_row, event_types
from tests.fixtures.sandbox import add_fault, at_provider, books

pytestmark = pytest.mark.postgres

OPERATOR = Actor("ops", "acme", "cli")


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        capability("refund", sandbox.url),
        capability("lookup", sandbox.url, side_effects=False),
    )


@pytest.fixture
def executor(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    http: Transport,
) -> Executor:
    return Executor(
        sessions, registry, ProviderClient(http), worker_id="worker-a", topics=DEFAULT_TOPICS
    )


async def answered(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    executor: Executor,
    sandbox_url: str,
    cap_id: str,
    status: int,
) -> tuple[str, S | None]:
    """A call whose first request the sandbox answers with ``status``."""
    key = f"k-{cap_id}-{status}"
    await add_fault(
        sandbox_url,
        {
            "kind": "error",
            "status": status,
            "idempotencyKey": at_provider(key),
            "method": "POST",
            "times": 1,
        },
    )
    call = await submit_call(sessions, registry, cap_id, {"n": status}, key=key)
    return call, await executor.execute(call, "acme")


@pytest.mark.parametrize("status", [408, 409])
async def test_a_side_effecting_call_answered_in_flight_is_result_unknown(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    executor: Executor,
    sandbox: SandboxServer,
    status: int,
) -> None:
    call, recorded = await answered(sessions, registry, executor, sandbox.url, "refund", status)

    assert recorded is S.RESULT_UNKNOWN
    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"], row["reconciliation_status"]) == (
        "result_unknown",
        "pending",
        "pending",
    )
    assert row["last_error"] == f"no definitive answer: HTTP {status}"
    assert "tool.call.failed" not in await event_types(sessions, call)
    # Not retried blindly: the one request the sandbox answered.
    assert (await books(sandbox.url))["received"] == {at_provider(f"k-refund-{status}"): 1}
    # Nobody may open a retry with a new key while the effect may be in flight.
    async with sessions() as session, session.begin():
        with pytest.raises(RetryNotAllowed):
            await retry_call(
                session,
                call,
                RetryRequest(reason="looks failed", new_idempotency_key=True),
                tenant="acme",
                actor=OPERATOR,
                registry=registry,
            )
    assert (await call_row(sessions, call))["status"] == "result_unknown"


@pytest.mark.parametrize("status", [408, 409])
async def test_a_read_only_call_answered_in_flight_is_repeated(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    executor: Executor,
    sandbox: SandboxServer,
    status: int,
) -> None:
    call, recorded = await answered(sessions, registry, executor, sandbox.url, "lookup", status)

    assert recorded is S.COMPLETED
    assert (await call_row(sessions, call))["result"] == {"echo": {"n": status}}
    assert (await books(sandbox.url))["received"] == {at_provider(f"k-lookup-{status}"): 2}


@pytest.mark.parametrize("status", [400, 422])
async def test_any_other_4xx_is_a_refusal(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    executor: Executor,
    sandbox: SandboxServer,
    status: int,
) -> None:
    call, recorded = await answered(sessions, registry, executor, sandbox.url, "refund", status)

    assert recorded is S.FAILED
    row = await call_row(sessions, call)
    assert (row["verification_status"], row["last_error"]) == (
        "confirmed_failure",
        f"provider refused the request: HTTP {status} rejected",
    )
    assert (await books(sandbox.url))["received"] == {at_provider(f"k-refund-{status}"): 1}
