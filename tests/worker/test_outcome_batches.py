"""What recording a batch of outcomes costs and writes: whatever its mix of outcomes,
one statement (the fenced UPDATE, its events and their outbox rows), one event and one
outbox row per recorded call, none for a call taken over, and a success whose run was
stopped meanwhile stopped at ``accepted``, also when the stop commits while the outcome
waits for the row (counted as psycopg executes them, on a real PostgreSQL)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.compensation import request_compensation
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.ledger.events import LOG_ONLY
from dispatcher.ledger.messages import Producer
from dispatcher.provider.client import OutcomeKind, ProviderClient, ProviderOutcome
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from dispatcher.worker.outcomes import Sent
from tests.fixtures.calls import submit_call
from tests.fixtures.rows import call_row, event_payloads, event_types
from tests.fixtures.statements import statements

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(capability("refund", sandbox.url))


async def last_message(sessions: Sessions, call: str) -> dict[str, Any]:
    """The payload of the call's latest event message."""
    async with sessions() as session:
        payload: dict[str, Any] = await session.scalar(
            select(outbox.c.payload)
            .where(outbox.c.payload["toolCallId"].astext == call)
            .order_by(outbox.c.id.desc())
            .limit(1)
        )
    return payload


async def last_event_id(sessions: Sessions, call: str) -> str:
    async with sessions() as session:
        event_id: str = await session.scalar(
            select(execution_events.c.event_id)
            .where(execution_events.c.tool_call_id == call)
            .order_by(execution_events.c.seq.desc())
            .limit(1)
        )
    return event_id


async def rows_of(sessions: Sessions, calls: list[str]) -> tuple[int, int]:
    """Published events (all but ``LOG_ONLY``'s) and event messages of ``calls``."""
    async with sessions() as session:
        events = await session.scalar(
            select(func.count())
            .select_from(execution_events)
            .where(
                execution_events.c.tool_call_id.in_(calls),
                execution_events.c.event_type.not_in(sorted(LOG_ONLY)),
            )
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


async def test_a_mixed_batch_is_recorded_in_one_statement_one_event_per_call(
    engine: AsyncEngine,
    sessions: Sessions,
    registry: CapabilityRegistry,
    http: Transport,
    caplog: pytest.LogCaptureFixture,
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

    with (
        statements(engine) as sent,
        caplog.at_level(logging.INFO, logger="tool_dispatcher.transitions"),
    ):
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
        # The event and its message are of the status recorded, the diverted call's too.
        assert (await event_types(sessions, call))[-1] == f"tool.call.{status}"
        message = await last_message(sessions, call)
        assert message["eventType"] == f"tool.call.{status}"
        assert message["payload"]["to"] == status
        assert message["eventId"] == await last_event_id(sessions, call)
        (line,) = [r for r in caplog.records if getattr(r, "tool_call_id", None) == call]
        assert line.to == status
    # Exactly one event and one outbox row per recorded call; none for the stale one.
    counted = await rows_of(sessions, moved)
    published_before = sum(t not in LOG_ONLY for c in moved for t in before[c])
    assert counted == (published_before + 5,) * 2
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
