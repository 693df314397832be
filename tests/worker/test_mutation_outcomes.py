"""Point B's mutants that the worker's other tests let live (``python -m bench.mutation
--module dispatcher/worker/outcomes.py``; also ``executor.py`` and ``claims.py``).

A re-send of a call in doubt, claimed and recorded the way the reconciler does it
(``Executor.claim_in(..., settles=True)``): its final answer settles the call, its
first dispatch time stands, and a fence it no longer holds refuses the claim. And what
a batch costs and writes: whatever its mix of outcomes, one statement (the fenced
UPDATE, its events and their outbox rows), one event and one outbox row per recorded
call, none for a call taken over, and a success whose run was stopped meanwhile
stopped at ``accepted`` (counted as psycopg executes them, on a real PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.compensation import request_compensation
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.errors import TransitionConflict
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import Fence
from dispatcher.provider.client import OutcomeKind, ProviderClient, ProviderOutcome
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.testing.registries import capability, registry_of
from dispatcher.testing.sandbox import SandboxServer
from dispatcher.worker.executor import Executor
from dispatcher.worker.outcomes import Sent
from tests.fixtures.calls import submit_call, unknown_call
from tests.fixtures.rows import call_row, event_payloads, event_types, events_of, outbox_rows

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
OWNER = "reconciler-1"


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(capability("refund", sandbox.url))


@pytest.fixture
async def executor(sessions: Sessions, registry: CapabilityRegistry) -> AsyncIterator[Executor]:
    async with Transport() as http:
        yield Executor(
            sessions, registry, ProviderClient(http), worker_id=OWNER, topics=DEFAULT_TOPICS
        )


async def in_doubt(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer, key: str
) -> tuple[str, int]:
    """A call lost before the provider applied it, first sent a minute ago and taken by
    the reconciler (its lease and a bumped version); returns it and that version."""
    async with Transport() as http:
        call = await unknown_call(
            sessions, registry, http, sandbox.url, "refund", key, {"kind": "drop_before_apply"}
        )
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls)
            .where(tool_calls.c.tool_call_id == call)
            .values(
                lease_owner=OWNER,
                version=tool_calls.c.version + 1,
                dispatched_at=text("now() - interval '60 seconds'"),
            )
        )
    return call, (await call_row(sessions, call))["version"]


async def resend(
    executor: Executor, sessions: Sessions, registry: CapabilityRegistry, call: str, fence: Fence
) -> S | None:
    async with sessions() as session, session.begin():
        claim = await executor.claim_in(
            session,
            call,
            registry.get("refund"),
            tenant="acme",
            expected=S.RESULT_UNKNOWN,
            dispatch_attempts=1,
            event_type=EventType.TOOL_CALL_REDISPATCHED,
            payload={"redispatch": 1},
            fence=fence,
            settles=True,
        )
    assert claim.settles and claim.version == fence.version + 1  # type: ignore[operator]
    return await executor.run(claim)


async def test_a_final_answer_to_a_resend_settles_the_call(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer, executor: Executor
) -> None:
    call, version = await in_doubt(sessions, registry, sandbox, "k-resend")
    first_sent = (await call_row(sessions, call))["dispatched_at"]

    assert await resend(executor, sessions, registry, call, Fence(OWNER, version)) is S.CONFIRMED

    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"], row["reconciliation_status"]) == (
        "confirmed",
        "confirmed_success",
        "settled",
    )
    assert row["result"] == {"echo": {"n": 1}}
    assert row["last_error"] is None
    assert row["completed_at"] is not None and row["next_reconcile_at"] is None
    assert row["dispatch_attempts"] == 2 and row["lease_owner"] is None
    # The provider's idempotency window counts from the first send, not this one.
    assert row["dispatched_at"] == first_sent
    events = await events_of(sessions, call)
    assert [e["event_type"] for e in events[-3:]] == [
        "tool.call.redispatched",
        "tool.call.accepted",
        "tool.call.confirmed",
    ]
    assert events[-3]["payload"]["redispatch"] == 1
    confirmed = events[-1]["payload"]
    assert (confirmed["httpStatus"], confirmed["error"]) == (200, None)
    assert confirmed["externalRequestId"] == row["external_request_id"]


async def test_a_providers_refusal_of_a_resend_settles_the_call_as_a_confirmed_failure(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer, executor: Executor
) -> None:
    call, version = await in_doubt(sessions, registry, sandbox, "k-refused")
    async with sessions() as session, session.begin():
        claim = await executor.claim_in(
            session,
            call,
            registry.get("refund"),
            tenant="acme",
            expected=S.RESULT_UNKNOWN,
            dispatch_attempts=1,
            fence=Fence(OWNER, version),
            settles=True,
        )
    refusal = "provider refused the request: HTTP 422 invalid_amount"
    answer = ProviderOutcome(OutcomeKind.FAILED, 1, 422, "req_r", {"code": "x"}, refusal)

    assert await executor.record(claim, answer) is S.CONFIRMED

    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"], row["reconciliation_status"]) == (
        "confirmed",
        "confirmed_failure",
        "settled",
    )
    assert (row["last_error"], row["result"]) == (refusal, {"code": "x"})


@pytest.mark.parametrize("stale", ["owner", "version"])
async def test_a_resend_under_a_fence_no_longer_held_is_refused(
    sessions: Sessions,
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    executor: Executor,
    stale: str,
) -> None:
    call, version = await in_doubt(sessions, registry, sandbox, f"k-stale-{stale}")
    fence = Fence("reconciler-0", version) if stale == "owner" else Fence(OWNER, version - 1)
    with pytest.raises(TransitionConflict, match="is no longer result_unknown"):
        await resend(executor, sessions, registry, call, fence)
    row = await call_row(sessions, call)
    assert (row["status"], row["dispatch_attempts"]) == ("result_unknown", 1)


async def test_a_resends_settlement_is_published_on_the_sites_topics(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer
) -> None:
    """Both steps of the settlement (``accepted``, then ``confirmed``) go to the events
    topic the worker was configured with, not the default one."""
    site = Topics(dispatch="site.commands", events="site.events", escalations="site.escalations")
    call, version = await in_doubt(sessions, registry, sandbox, "k-site")
    async with Transport() as http:
        executor = Executor(sessions, registry, ProviderClient(http), worker_id=OWNER, topics=site)
        assert await resend(executor, sessions, registry, call, Fence(OWNER, version)) is (
            S.CONFIRMED
        )
    published = [
        r["payload"]["eventType"]
        for r in await outbox_rows(sessions, site.events)
        if r["payload"]["toolCallId"] == call
    ]
    assert published == ["tool.call.redispatched", "tool.call.accepted", "tool.call.confirmed"]
    assert [
        r
        for r in await outbox_rows(sessions, DEFAULT_TOPICS.events)
        if r["payload"]["eventType"] in ("tool.call.accepted", "tool.call.confirmed")
    ] == []


@contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[str]]:
    """Every statement the engine sends while the block runs."""
    sent: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count)


async def rows_of(sessions: Sessions, calls: list[str]) -> tuple[int, int]:
    """Events and event messages of ``calls``."""
    async with sessions() as session:
        events = await session.scalar(
            select(func.count())
            .select_from(execution_events)
            .where(execution_events.c.tool_call_id.in_(calls))
        )
        messages = await session.scalar(
            select(func.count())
            .select_from(outbox)
            .where(
                outbox.c.topic == DEFAULT_TOPICS.events,
                outbox.c.payload["toolCallId"].astext.in_(calls),
            )
        )
    return events or 0, messages or 0


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (
            ProviderOutcome(OutcomeKind.UNKNOWN, 1, 500, error="no definitive answer"),
            S.RESULT_UNKNOWN,
        ),
        (
            ProviderOutcome(OutcomeKind.NOT_SENT, 3, error="not sent: ConnectError"),
            S.RESULT_UNKNOWN,
        ),
        (ProviderOutcome(OutcomeKind.ACCEPTED, 1, 202, "req_p"), S.ACCEPTED),
    ],
    ids=["ambiguous", "not-sent", "pending"],
)
async def test_a_resend_answer_that_is_not_final_does_not_settle_the_call(
    sessions: Sessions,
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    executor: Executor,
    answer: ProviderOutcome,
    status: S,
) -> None:
    """Only a final answer settles a re-send: an ambiguous one (with a status code) or
    none at all leaves the call in doubt, and a pending one leaves it accepted."""
    call, version = await in_doubt(sessions, registry, sandbox, f"k-{status}-{answer.kind}")
    async with sessions() as session, session.begin():
        claim = await executor.claim_in(
            session,
            call,
            registry.get("refund"),
            tenant="acme",
            expected=S.RESULT_UNKNOWN,
            dispatch_attempts=1,
            fence=Fence(OWNER, version),
            settles=True,
        )

    assert await executor.record(claim, answer) is status

    row = await call_row(sessions, call)
    assert (row["status"], row["reconciliation_status"]) == (status.value, "pending")
    assert row["verification_status"] == "pending"
    assert (await events_of(sessions, call))[-1]["event_type"] == f"tool.call.{status.value}"


async def test_a_mixed_batch_is_recorded_in_one_statement_one_event_per_call(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry, http: Transport
) -> None:
    calls = [
        await submit_call(sessions, registry, "refund", {"n": i}, key=f"k-{i}") for i in range(7)
    ]
    worker = Executor(
        sessions, registry, ProviderClient(http), worker_id="worker-a", topics=DEFAULT_TOPICS
    )
    claims = {c.tool_call_id: c for c in await worker.claim_many([("acme", c) for c in calls])}
    done, pending, refused, lost, stopped, taken, stolen = calls
    # One call's run is stopped while it is in flight; another is taken over (its
    # claim's version moved on), so this worker's answer for it is stale; and one is
    # held by another owner at the same version (the owner fence alone refuses it).
    async with sessions() as session, session.begin():
        await request_compensation(
            session, stopped, tenant="acme", reason="run stopped", producer=Producer.OPERATOR
        )
        await session.execute(
            update(tool_calls)
            .where(tool_calls.c.tool_call_id == taken)
            .values(version=tool_calls.c.version + 1)
        )
        await session.execute(
            update(tool_calls).where(tool_calls.c.tool_call_id == stolen).values(lease_owner="b")
        )
    answers = {
        done: ProviderOutcome(OutcomeKind.COMPLETED, 1, 200, "req-1", {"done": True}),
        pending: ProviderOutcome(OutcomeKind.ACCEPTED, 1, 202, "req-2"),
        refused: ProviderOutcome(OutcomeKind.FAILED, 1, 400, None, {"code": "x"}, "refused"),
        lost: ProviderOutcome(OutcomeKind.UNKNOWN, 1, 500, error="no definitive answer"),
        stopped: ProviderOutcome(OutcomeKind.COMPLETED, 1, 200, "req-5", {"done": True}),
        taken: ProviderOutcome(OutcomeKind.COMPLETED, 1, 200, "req-6", {"zombie": True}),
        stolen: ProviderOutcome(OutcomeKind.COMPLETED, 1, 200, "req-7", {"zombie": True}),
    }
    before = {call: await event_types(sessions, call) for call in calls}

    with statements(engine) as sent:
        recorded = await worker.record_many([Sent(claims[c], answers[c]) for c in calls])

    # One round trip: the fenced UPDATE, its events and their outbox rows.
    (statement,) = sent
    assert "UPDATE tool_calls" in statement
    assert "INSERT INTO execution_events" in statement and "INSERT INTO outbox" in statement
    assert recorded == {
        ("acme", done): S.COMPLETED,
        ("acme", pending): S.ACCEPTED,
        ("acme", refused): S.FAILED,
        ("acme", lost): S.RESULT_UNKNOWN,
        # Its success waits at `accepted` for the reconciler to undo it.
        ("acme", stopped): S.ACCEPTED,
        ("acme", taken): None,
        ("acme", stolen): None,
    }
    moved = [done, pending, refused, lost, stopped]
    statuses = ["completed", "accepted", "failed", "result_unknown", "accepted"]
    for call, status in zip(moved, statuses, strict=True):
        assert (await call_row(sessions, call))["status"] == status
        (new,) = (await event_payloads(sessions, call))[len(before[call]) :]
        assert (new["from"], new["to"]) == (["dispatching"], status)
        assert (new["worker"], new["claimVersion"]) == ("worker-a", claims[call].version)
    # Exactly one event and one outbox row per recorded call; none for the stale one.
    counted = await rows_of(sessions, moved)
    assert counted == (sum(map(len, (before[c] for c in moved))) + 5,) * 2
    for call in (taken, stolen):
        assert await event_types(sessions, call) == before[call]
        zombie = await call_row(sessions, call)
        assert (zombie["status"], zombie["result"]) == ("dispatching", None)

    row = await call_row(sessions, done)
    assert (row["verification_status"], row["result"]) == ("confirmed_success", {"done": True})
    assert row["completed_at"] is not None and row["reconciliation_status"] == "not_needed"
    row = await call_row(sessions, refused)
    assert (row["verification_status"], row["result"]) == ("confirmed_failure", {"code": "x"})
    assert row["completed_at"] is not None and row["last_error"] == "refused"
    row = await call_row(sessions, stopped)
    assert (row["verification_status"], row["reconciliation_status"]) == ("pending", "pending")
    assert row["result"] is None and row["completed_at"] is None
    assert row["next_reconcile_at"] is not None and row["external_request_id"] == "req-5"


async def test_a_success_waits_for_a_concurrent_stop_and_honours_its_mark(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport
) -> None:
    """The stop marks the call and has not committed when the success is recorded: the
    outcome's UPDATE waits for the row and decides on the committed mark."""
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="k-race")
    worker = Executor(
        sessions, registry, ProviderClient(http), worker_id="worker-a", topics=DEFAULT_TOPICS
    )
    claim = await worker.claim(call, "acme")
    assert claim is not None
    success = ProviderOutcome(OutcomeKind.COMPLETED, 1, 200, "req-1", {"done": True})
    async with sessions() as stop, stop.begin():
        await request_compensation(
            stop, call, tenant="acme", reason="run stopped", producer=Producer.OPERATOR
        )
        recording = asyncio.create_task(worker.record(claim, success))
        await until_waiting_for_a_lock(sessions)
        assert not recording.done()
    assert await recording is S.ACCEPTED
    row = await call_row(sessions, call)
    assert (row["status"], row["reconciliation_status"]) == ("accepted", "pending")


async def until_waiting_for_a_lock(sessions: Sessions) -> None:
    """Until some backend of this database waits for a row lock."""
    waiting = text(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    for _ in range(500):
        async with sessions() as session:
            if await session.scalar(waiting):
                return
        await asyncio.sleep(0.01)
    raise AssertionError("the outcome never waited for the stop's row lock")
