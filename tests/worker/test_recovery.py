"""The recovery sweep (three-way rule) and lease fencing, on real PostgreSQL and the
real sandbox; what the sweep leaves behind for the reconciler and for the next worker,
on the topics it is given, and which lapsed claims one sweep takes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.ledger.messages import Producer, ce_source
from dispatcher.provider.client import OutcomeKind, ProviderClient, ProviderOutcome
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.tenancy import ordering_key
from dispatcher.worker.executor import Executor
from dispatcher.worker.recovery import recover_expired
from tests.fixtures.calls import expire_leases, insert_call, submit_call
from tests.fixtures.rows import call_row, event_payloads, event_types, events_of, outbox_rows
from tests.fixtures.sandbox import at_provider, books

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
# Topics of this deployment's own: recovery must write where it is told to.
TOPICS = Topics(dispatch="site.commands", events="site.events", escalations="site.escalations")
# For the tests that need no provider (the fixture's registry sends to the sandbox).
REGISTRY = registry_of(capability("refund"), capability("lookup", side_effects=False))


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


async def lapsed(sessions: Sessions, cap_id: str, seconds_ago: int = 5) -> str:
    """A call claimed by ``worker-dead`` whose lease ran out ``seconds_ago``."""
    return await insert_call(
        sessions,
        "dispatching",
        cap_id=cap_id,
        lease_owner="worker-dead",
        lease_expires_at=text(f"now() - interval '{seconds_ago} seconds'"),
        version=3,
    )


async def now(sessions: Sessions) -> Any:
    async with sessions() as session:
        return (await session.execute(text("SELECT now()"))).scalar_one()


async def test_a_lost_side_effect_is_handed_to_the_reconciler_due_at_once(
    sessions: Sessions,
) -> None:
    call = await lapsed(sessions, "refund")
    report = await recover_expired(sessions, REGISTRY, topics=TOPICS)
    assert (report.marked_unknown, report.redispatched) == ([call], [])
    assert [r["key"] for r in await outbox_rows(sessions, TOPICS.events)] == [
        ordering_key("acme", "run-1")
    ]

    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"], row["reconciliation_status"]) == (
        "result_unknown",
        "pending",
        "pending",
    )
    assert row["last_error"] == "worker_lost: outcome not recorded"
    assert (row["lease_owner"], row["lease_expires_at"]) == (None, None)
    assert row["next_reconcile_at"] is not None and row["next_reconcile_at"] <= await now(sessions)
    event = (await events_of(sessions, call))[-1]
    assert event["payload"] == {
        "from": ["dispatching"],
        "to": "result_unknown",
        "reason": "worker lost between claim and outcome (lease expired)",
        "deadWorker": "worker-dead",
        "claimVersion": 3,
        "rule": "mark_unknown",
    }


async def test_a_call_of_an_unregistered_capability_is_never_sent_again(
    sessions: Sessions,
) -> None:
    call = await lapsed(sessions, "retired")
    report = await recover_expired(sessions, REGISTRY, topics=DEFAULT_TOPICS)
    assert report.marked_unknown == [call]
    assert (await call_row(sessions, call))["status"] == "result_unknown"


async def test_a_lost_read_is_sent_again_by_a_command_caused_by_its_redispatch(
    sessions: Sessions,
) -> None:
    call = await lapsed(sessions, "lookup")
    report = await recover_expired(sessions, REGISTRY, topics=TOPICS)
    assert (report.redispatched, report.marked_unknown) == ([call], [])

    row = await call_row(sessions, call)
    assert (row["status"], row["lease_owner"], row["lease_expires_at"]) == (
        "authorized",
        None,
        None,
    )
    event = (await events_of(sessions, call))[-1]
    assert event["payload"]["rule"] == "redispatch"
    assert event["payload"]["deadWorker"] == "worker-dead"
    [command] = [
        r
        for r in await outbox_rows(sessions, TOPICS.dispatch)
        if r["key"] == ordering_key("acme", call)
    ]
    assert command["payload"]["causationId"] == str(event["event_id"])
    assert command["headers"]["ce_source"] == ce_source(Producer.RECOVERY)
    assert [r["key"] for r in await outbox_rows(sessions, TOPICS.events)] == [
        ordering_key("acme", "run-1")
    ]


async def test_one_sweep_takes_at_most_its_limit_oldest_lease_first(sessions: Sessions) -> None:
    newer = await lapsed(sessions, "refund", seconds_ago=5)
    older = await lapsed(sessions, "refund", seconds_ago=50)
    fresh = await insert_call(
        sessions,
        "dispatching",
        cap_id="refund",
        lease_owner="worker-alive",
        lease_expires_at=text("now() + interval '60 seconds'"),
    )
    first = await recover_expired(sessions, REGISTRY, topics=DEFAULT_TOPICS, limit=1)
    assert first.marked_unknown == [older]
    second = await recover_expired(sessions, REGISTRY, topics=DEFAULT_TOPICS, limit=1)
    assert second.marked_unknown == [newer]
    assert (await recover_expired(sessions, REGISTRY, topics=DEFAULT_TOPICS)).total == 0
    assert (await call_row(sessions, fresh))["status"] == "dispatching"
