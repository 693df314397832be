"""The recovery sweep (three-way rule) and lease fencing, on real PostgreSQL and the
real sandbox."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.provider.client import OutcomeKind, ProviderClient, ProviderOutcome
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.tenancy import ordering_key
from dispatcher.testing.registries import capability, registry_of
from dispatcher.testing.sandbox import SandboxServer
from dispatcher.worker.executor import Executor
from dispatcher.worker.recovery import recover_expired
from tests.fixtures.calls import expire_leases, submit_call
from tests.fixtures.rows import call_row, event_payloads, event_types, outbox_rows
from tests.fixtures.sandbox import at_provider, books

pytestmark = pytest.mark.postgres


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        capability("refund", sandbox.url), capability("lookup", sandbox.url, side_effects=False)
    )


@pytest.fixture
async def executor(
    sessions: async_sessionmaker[AsyncSession], registry: CapabilityRegistry
) -> AsyncIterator[Executor]:
    async with Transport() as http:
        yield Executor(
            sessions,
            registry,
            ProviderClient(http),
            worker_id="worker-a",
            topics=DEFAULT_TOPICS,
        )


async def sweep(
    sessions: async_sessionmaker[AsyncSession], registry: CapabilityRegistry
) -> tuple[list[str], list[str]]:
    report = await recover_expired(sessions, registry, topics=DEFAULT_TOPICS)
    return report.redispatched, report.marked_unknown


async def test_side_effecting_call_of_a_dead_worker_becomes_result_unknown(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    executor: Executor,
    sandbox: SandboxServer,
) -> None:
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="k-1")
    assert await executor.claim(call, "acme") is not None  # the worker "dies" here
    assert await sweep(sessions, registry) == ([], [])  # lease still valid: untouched

    await expire_leases(sessions)
    assert await sweep(sessions, registry) == ([], [call])

    row = await call_row(sessions, call)
    assert row["status"] == "result_unknown"
    assert row["reconciliation_status"] == "pending"
    assert row["lease_owner"] is None
    assert "worker_lost" in row["last_error"]
    assert (await event_types(sessions, call))[-1] == "tool.call.result_unknown"
    why = (await event_payloads(sessions, call))[-1]
    assert why["rule"] == "mark_unknown" and why["deadWorker"] == "worker-a"
    assert (await books(sandbox.url))["received"] == {}  # nothing was re-sent


async def test_read_only_call_of_a_dead_worker_is_dispatched_again(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    executor: Executor,
) -> None:
    call = await submit_call(sessions, registry, "lookup", {"n": 1}, key="k-ro")
    assert await executor.claim(call, "acme") is not None
    await expire_leases(sessions)

    assert await sweep(sessions, registry) == ([call], [])

    assert (await call_row(sessions, call))["status"] == "authorized"
    commands = [
        r
        for r in await outbox_rows(sessions, DEFAULT_TOPICS.dispatch)
        if r["key"] == ordering_key("acme", call)
    ]
    assert len(commands) == 2  # the original and the re-dispatch
    assert await executor.execute(call, "acme") is S.COMPLETED


async def test_a_stalled_worker_is_fenced_out_after_takeover(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    executor: Executor,
) -> None:
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="k-zombie")
    claim = await executor.claim(call, "acme")
    assert claim is not None
    await expire_leases(sessions)
    assert await sweep(sessions, registry) == ([], [call])
    before = await event_types(sessions, call)

    # The zombie wakes up holding a real answer: it must not be able to record it.
    late = ProviderOutcome(OutcomeKind.COMPLETED, 1, 200, "req_late", {"ok": True})
    assert await executor.record(claim, late) is None

    row = await call_row(sessions, call)
    assert row["status"] == "result_unknown"
    assert row["external_request_id"] is None
    assert await event_types(sessions, call) == before


async def test_a_recorded_outcome_is_never_run_again(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    executor: Executor,
    sandbox: SandboxServer,
) -> None:
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="k-done")
    assert await executor.execute(call, "acme") is S.COMPLETED
    await expire_leases(sessions)
    assert await sweep(sessions, registry) == ([], [])
    assert await executor.execute(call, "acme") is None  # a redelivered command
    assert (await books(sandbox.url))["effects"] == {at_provider("k-done"): 1}


async def test_concurrent_sweepers_take_each_call_once(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    executor: Executor,
) -> None:
    calls = [
        await submit_call(sessions, registry, "refund", {"n": i}, key=f"k-{i}") for i in range(20)
    ]
    for call in calls:
        assert await executor.claim(call, "acme") is not None
    await expire_leases(sessions)

    reports = await asyncio.gather(*(sweep(sessions, registry) for _ in range(4)))

    marked = [c for _, unknown in reports for c in unknown]
    assert sorted(marked) == sorted(calls)
    for call in calls:
        assert (await event_types(sessions, call)).count("tool.call.result_unknown") == 1
