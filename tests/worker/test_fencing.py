"""Outcome fencing where the lease owner and version decide, not the status: the call
is ``dispatching`` again under a newer claim when the stalled worker (the zombie)
wakes up with its late answer. And a claim whose lease lapsed before the send is
never sent."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.provider.client import OutcomeKind, ProviderClient, ProviderOutcome
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Claim, Executor
from dispatcher.worker.recovery import recover_expired
from tests.fixtures.calls import expire_leases, submit_call
from tests.fixtures.capabilities import reconcile_capability
from tests.fixtures.reconciling import new_reconciler
from tests.fixtures.rows import call_row, event_types
from tests.fixtures.sandbox import add_fault, at_provider, books
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres

MakeExecutor = Callable[[str], Executor]
# What the zombie holds: an answer it got before it stalled, wrong for the new claim.
LATE = ProviderOutcome(OutcomeKind.COMPLETED, 1, 200, "req_zombie", {"zombie": True})


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    # The re-send below is held 1 s at the sandbox: its request gets far longer than
    # that, so a loaded machine does not turn it into a timeout (result_unknown).
    return registry_of(
        reconcile_capability("refund", sandbox.url, timeout=10.0),
        capability("lookup", sandbox.url, side_effects=False),
    )


@pytest.fixture
def make_executor(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    http: Transport,
) -> MakeExecutor:
    def make(worker_id: str) -> Executor:
        return Executor(
            sessions, registry, ProviderClient(http), worker_id=worker_id, topics=DEFAULT_TOPICS
        )

    return make


async def redispatched_read_only_call(
    sessions: async_sessionmaker[AsyncSession], registry: CapabilityRegistry, zombie: Executor
) -> tuple[str, Claim]:
    """A read-only call the zombie claimed, whose lease lapsed and which the recovery
    sweep put back to ``authorized``; returns the call and the zombie's claim."""
    call = await submit_call(sessions, registry, "lookup", {"n": 1}, key="k-ro")
    stale = await zombie.claim(call, "acme")
    assert stale is not None
    await expire_leases(sessions)
    report = await recover_expired(sessions, registry, topics=DEFAULT_TOPICS)
    assert report.redispatched == [call]
    return call, stale


async def test_a_zombie_cannot_record_over_another_workers_claim_of_a_read_only_call(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    make_executor: MakeExecutor,
) -> None:
    zombie, second = make_executor("worker-zombie"), make_executor("worker-b")
    call, stale = await redispatched_read_only_call(sessions, registry, zombie)
    claim = await second.claim(call, "acme")
    assert claim is not None
    before = await event_types(sessions, call)

    assert await zombie.record(stale, LATE) is None

    row = await call_row(sessions, call)
    assert (row["status"], row["lease_owner"], row["version"]) == (
        "dispatching",
        "worker-b",
        claim.version,
    )
    assert row["result"] is None and row["external_request_id"] is None
    assert await event_types(sessions, call) == before
    # The second worker's real answer is the one recorded.
    assert await second.run(claim) is S.COMPLETED
    row = await call_row(sessions, call)
    assert row["result"] == {"echo": {"n": 1}}
    assert row["external_request_id"].startswith("req_")


async def test_a_zombie_cannot_record_over_its_own_newer_claim(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    make_executor: MakeExecutor,
) -> None:
    """The same worker claims the re-dispatched call again: the owner matches, only the
    version of the stale claim fences its late answer out."""
    worker = make_executor("worker-a")
    call, stale = await redispatched_read_only_call(sessions, registry, worker)
    claim = await worker.claim(call, "acme")
    assert claim is not None

    assert await worker.record(stale, LATE) is None

    assert (await call_row(sessions, call))["status"] == "dispatching"
    assert await worker.run(claim) is S.COMPLETED
    assert (await call_row(sessions, call))["result"] == {"echo": {"n": 1}}


async def test_a_zombie_cannot_record_over_a_reconcilers_resend(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
    make_executor: MakeExecutor,
) -> None:
    """A side-effecting call: the zombie claimed it and stalled before sending, the
    sweep marked it unknown, the reconciler found no record and re-sends it (the call
    is ``dispatching`` under the reconciler) when the zombie records its late answer."""
    zombie = make_executor("worker-zombie")
    call = await submit_call(sessions, registry, "refund", {"n": 2}, key="k-se")
    stale = await zombie.claim(call, "acme")
    assert stale is not None
    await expire_leases(sessions)
    assert (await recover_expired(sessions, registry, topics=DEFAULT_TOPICS)).marked_unknown
    # The re-send is held at the sandbox while the zombie wakes up.
    await add_fault(
        sandbox.url,
        {
            "kind": "latency",
            "latencyMs": 1000,
            "method": "POST",
            "idempotencyKey": at_provider("k-se"),
        },
    )
    reconciler = new_reconciler(sessions, registry, http, owner="reconciler-r")
    resend = asyncio.create_task(reconciler.run_pass())

    async def resending() -> bool:
        row = await call_row(sessions, call)
        return bool(row["status"] == "dispatching" and row["lease_owner"] == "reconciler-r")

    await eventually(resending, within=10, every=0.01)
    assert await zombie.record(stale, LATE) is None
    assert (await call_row(sessions, call))["status"] == "dispatching"

    assert (await resend).counts == {"redispatched": 1}
    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"]) == ("confirmed", "confirmed_success")
    assert row["result"] == {"echo": {"n": 2}}
    assert row["external_request_id"] != "req_zombie"
    assert "tool.call.completed" not in await event_types(sessions, call)
    assert (await books(sandbox.url))["effects"] == {at_provider("k-se"): 1}


async def test_a_claim_whose_lease_lapsed_before_the_send_is_not_sent(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    make_executor: MakeExecutor,
) -> None:
    worker = make_executor("worker-a")
    call = await submit_call(sessions, registry, "refund", {"n": 3}, key="k-lapsed")
    claim = await worker.claim(call, "acme")
    assert claim is not None
    before = await event_types(sessions, call)
    # The worker stalled between its claim and the send for longer than the lease.
    stalled = dataclasses.replace(claim, claimed_at=claim.claimed_at - claim.lease_seconds - 1)

    assert await worker.run(stalled) is None

    assert (await books(sandbox.url))["received"] == {}
    row = await call_row(sessions, call)
    assert (row["status"], row["lease_owner"]) == ("dispatching", "worker-a")
    assert await event_types(sessions, call) == before
