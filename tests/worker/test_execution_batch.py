"""The batch path of the executor: one claim transaction for a fetched batch, the
requests in flight together, one fenced record transaction (real PostgreSQL and the
real sandbox)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.ledger.events import LOG_ONLY
from dispatcher.provider.client import OutcomeKind, ProviderClient, ProviderOutcome
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from dispatcher.worker.outcomes import Sent
from dispatcher.worker.recovery import recover_expired
from tests.fixtures.calls import insert_call, submit_call
from tests.fixtures.rows import call_row, event_payloads, event_types
from tests.fixtures.sandbox import at_provider, books

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        capability("refund", sandbox.url), capability("lookup", sandbox.url, side_effects=False)
    )


def executor_of(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport, worker: str
) -> Executor:
    return Executor(
        sessions,
        registry,
        ProviderClient(http),
        worker_id=worker,
        topics=DEFAULT_TOPICS,
    )


async def submit_calls(sessions: Sessions, registry: CapabilityRegistry, n: int) -> list[str]:
    return [
        await submit_call(sessions, registry, "refund", {"n": i}, key=f"k-{i}") for i in range(n)
    ]


async def set_status(sessions: Sessions, tool_call_id: str, status: str) -> None:
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls)
            .where(tool_calls.c.tool_call_id == tool_call_id)
            .values(status=status)
        )


async def test_only_the_authorized_calls_of_a_batch_are_claimed_once(
    sessions: Sessions,
    registry: CapabilityRegistry,
    http: Transport,
    sandbox: SandboxServer,
) -> None:
    fresh_a, fresh_b, fresh_c, done, held, cancelled = await submit_calls(sessions, registry, 6)
    worker = executor_of(sessions, registry, http, "worker-a")
    assert await worker.execute(done, "acme") is S.COMPLETED
    assert await executor_of(sessions, registry, http, "worker-b").claim(held, "acme") is not None
    await set_status(sessions, cancelled, "cancelled")
    before = {call: await event_types(sessions, call) for call in (done, held, cancelled)}

    # A redelivered fetch: duplicates, a finished call, one another worker holds, one
    # that is no longer authorized, and one that does not exist.
    batch = [fresh_a, fresh_a, done, fresh_b, held, cancelled, "no-such-call", fresh_c, fresh_b]
    statuses = await worker.execute_many([("acme", call) for call in batch])

    assert statuses == {("acme", c): S.COMPLETED for c in (fresh_a, fresh_b, fresh_c)}
    for call in (fresh_a, fresh_b, fresh_c):
        assert (await event_types(sessions, call))[2:] == [
            "tool.call.dispatching",
            "tool.call.completed",
        ]
        row = await call_row(sessions, call)
        assert row["dispatch_attempts"] == 1 and row["lease_owner"] is None
        claimed = (await event_payloads(sessions, call))[2]
        assert claimed["worker"] == "worker-a" and claimed["leaseSeconds"] > 0
    for call, events in before.items():
        assert await event_types(sessions, call) == events
    assert (await call_row(sessions, held))["lease_owner"] == "worker-b"
    assert (await call_row(sessions, cancelled))["status"] == "cancelled"
    received = (await books(sandbox.url))["received"]
    assert received == {at_provider(f"k-{i}"): 1 for i in range(4)}  # fresh_a..c, and done once


async def test_a_taken_over_call_is_not_recorded_and_the_rest_of_its_batch_is(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport
) -> None:
    calls = await submit_calls(sessions, registry, 3)
    worker = executor_of(sessions, registry, http, "worker-a")
    claims = await worker.claim_many([("acme", c) for c in calls])
    assert sorted(c.tool_call_id for c in claims) == sorted(calls)
    lost = calls[1]
    # The worker stalls; its lease on one call lapses and the sweep takes it over.
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls)
            .where(tool_calls.c.tool_call_id == lost)
            .values(lease_expires_at=text("now() - interval '1 second'"))
        )
    report = await recover_expired(sessions, registry, topics=DEFAULT_TOPICS)
    assert report.marked_unknown == [lost]
    taken_over = await event_types(sessions, lost)

    answers = [
        Sent(c, ProviderOutcome(OutcomeKind.COMPLETED, 1, 200, f"req-{c.tool_call_id}", {"ok": 1}))
        for c in claims
    ]
    statuses = await worker.record_many(answers)

    assert statuses == {
        ("acme", calls[0]): S.COMPLETED,
        ("acme", lost): None,
        ("acme", calls[2]): S.COMPLETED,
    }
    row = await call_row(sessions, lost)
    assert row["status"] == "result_unknown" and row["external_request_id"] is None
    assert await event_types(sessions, lost) == taken_over
    for call in (calls[0], calls[2]):
        row = await call_row(sessions, call)
        assert row["status"] == "completed" and row["external_request_id"] == f"req-{call}"
        assert row["result"] == {"ok": 1}


async def test_every_outcome_class_is_recorded_in_one_batch(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport
) -> None:
    calls = await submit_calls(sessions, registry, 5)
    worker = executor_of(sessions, registry, http, "worker-a")
    claims = {c.tool_call_id: c for c in await worker.claim_many([("acme", c) for c in calls])}
    outcomes = [
        ProviderOutcome(OutcomeKind.COMPLETED, 1, 200, "req-1", {"done": True}),
        ProviderOutcome(OutcomeKind.ACCEPTED, 1, 202, "req-2"),
        ProviderOutcome(OutcomeKind.FAILED, 1, 400, None, error="refused"),
        ProviderOutcome(OutcomeKind.NOT_SENT, 3, error="not sent: ConnectError"),
        ProviderOutcome(OutcomeKind.UNKNOWN, 1, 500, error="no definitive answer"),
    ]

    statuses = await worker.record_many(
        [Sent(claims[call], outcome) for call, outcome in zip(calls, outcomes, strict=True)]
    )

    assert [statuses[("acme", c)] for c in calls] == [
        S.COMPLETED,
        S.ACCEPTED,
        S.FAILED,
        S.FAILED,
        S.RESULT_UNKNOWN,
    ]
    rows = [await call_row(sessions, c) for c in calls]
    expected: list[dict[str, Any]] = [
        {"verification_status": "confirmed_success", "reconciliation_status": "not_needed"},
        {"verification_status": "pending", "reconciliation_status": "pending"},
        {"verification_status": "confirmed_failure", "last_error": "refused"},
        {"verification_status": "not_observed", "last_error": "not sent: ConnectError"},
        {"verification_status": "pending", "reconciliation_status": "pending"},
    ]
    for row, want in zip(rows, expected, strict=True):
        assert {k: row[k] for k in want} == want
        assert row["lease_owner"] is None and row["lease_expires_at"] is None
    assert rows[0]["completed_at"] is not None and rows[0]["external_request_id"] == "req-1"
    assert rows[1]["next_reconcile_at"] is not None and rows[1]["completed_at"] is None
    assert rows[4]["next_reconcile_at"] is not None
    assert (await event_types(sessions, calls[0]))[-2:] == [
        "tool.call.dispatching",
        "tool.call.completed",
    ]
    assert (await event_payloads(sessions, calls[3]))[-1]["attempts"] == 3
    async with sessions() as session:
        events = await session.scalar(
            select(func.count())
            .select_from(execution_events)
            .where(execution_events.c.event_type.not_in(sorted(LOG_ONLY)))
        )
        messages = await session.scalar(
            select(func.count()).select_from(outbox).where(outbox.c.topic == DEFAULT_TOPICS.events)
        )
    assert events == messages  # every published event has its outbox row


async def test_a_call_of_an_unregistered_capability_is_left_authorized(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport
) -> None:
    known, unknown = await submit_calls(sessions, registry, 2)
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls)
            .where(tool_calls.c.tool_call_id == unknown)
            .values(capability_id="gone")
        )
    claims = await executor_of(sessions, registry, http, "worker-a").claim_many(
        [("acme", known), ("acme", unknown)]
    )
    assert [c.tool_call_id for c in claims] == [known]
    assert (await call_row(sessions, unknown))["status"] == "authorized"


async def test_a_request_that_cannot_be_built_fails_alone_and_the_batch_is_recorded(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport
) -> None:
    good = await submit_calls(sessions, registry, 4)
    # Inserted past intake, which may refuse such a key: it cannot travel as an
    # Idempotency-Key header (UnicodeEncodeError while the request is checked).
    bad = await insert_call(sessions, "authorized", cap_id="refund", idempotency_key="ключ")
    worker = executor_of(sessions, registry, http, "worker-a")

    order = [good[0], good[1], bad, good[2], good[3]]
    statuses = await worker.execute_many([("acme", call) for call in order])

    assert statuses == {
        **{("acme", call): S.COMPLETED for call in good},
        ("acme", bad): S.FAILED,
    }
    row = await call_row(sessions, bad)
    assert row.status == "failed"
    assert row.last_error == "request not sendable: UnicodeEncodeError; nothing was sent"
    assert row.dispatch_attempts == 1
    for call in good:
        assert (await call_row(sessions, call)).status == "completed"
