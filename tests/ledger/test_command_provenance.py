"""Every dispatch command says who wrote it and why, on real PostgreSQL: its
``ce_source`` names its writer (the same producer as the writer's event) and its
``causationId`` is the event that writer recorded in the same transaction.

Each writer is driven through its own code path (intake, an approval, an operator's
retry, a redrive, the recovery sweep) and the command is read back from the outbox,
as the relay will publish it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control import approvals
from dispatcher.control.approvals import DecisionRequest
from dispatcher.control.escalations import Actor
from dispatcher.control.retry import RetryRequest, retry_call
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.intake.service import SubmitRequest, submit
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import BulkMove, move, move_many
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.tenancy import ordering_key
from dispatcher.worker.executor import Executor
from dispatcher.worker.recovery import recover_expired
from dispatcher.worker.redrive import redrive_stale
from tests.fixtures.calls import insert_call, submit_call
from tests.fixtures.capabilities import approval_capability
from tests.fixtures.rows import approval_of

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
BOB = Actor("bob", "acme", "test")
NOWHERE = "http://127.0.0.1:9"  # nothing is sent: every path stops at the outbox


@pytest.fixture
def registry() -> CapabilityRegistry:
    return registry_of(
        capability("refund", NOWHERE),
        capability("lookup", NOWHERE, side_effects=False),
        approval_capability("refund-big", NOWHERE),
    )


async def by_intake(sessions: Sessions, registry: CapabilityRegistry) -> str:
    return await submit_call(sessions, registry, "refund", {"n": 1})


async def by_approval(sessions: Sessions, registry: CapabilityRegistry) -> str:
    async with sessions() as session, session.begin():
        submission = await submit(
            session,
            SubmitRequest(run_id="run-1", capability_id="refund-big", input={"n": 2}),
            tenant="acme",
            registry=registry,
            submitted_by="alice",
        )
    call = submission.view.tool_call_id
    approval_id = (await approval_of(sessions, call))["approval_id"]
    async with sessions() as session, session.begin():
        await approvals.decide(
            session,
            approval_id,
            DecisionRequest(decision="approve", reason="fine"),
            actor=BOB,
            scopes={"approve"},
            tenant="acme",
            registry=registry,
        )
    return call


async def by_retry(sessions: Sessions, registry: CapabilityRegistry) -> str:
    call = await insert_call(sessions, "failed", cap_id="refund", last_error="HTTP 400")
    async with sessions() as session, session.begin():
        await retry_call(
            session,
            call,
            RetryRequest(reason="provider fixed"),
            tenant="acme",
            actor=BOB,
            registry=registry,
        )
    return call


async def by_redrive(sessions: Sessions, registry: CapabilityRegistry) -> str:
    call = await submit_call(sessions, registry, "refund", {"n": 3})
    # What a broker that forgot its messages leaves: published, and long ago.
    back = text("now() - interval '120 seconds'")
    async with sessions() as session, session.begin():
        await session.execute(update(outbox).values(published_at=back, created_at=back))
        await session.execute(update(tool_calls).values(updated_at=back))
    assert await redrive_stale(sessions, topics=DEFAULT_TOPICS, older_than_seconds=60) == [call]
    return call


async def by_recovery(sessions: Sessions, registry: CapabilityRegistry) -> str:
    call = await submit_call(sessions, registry, "lookup", {"n": 4})
    async with Transport() as http:
        executor = Executor(
            sessions, registry, ProviderClient(http), worker_id="w-dead", topics=DEFAULT_TOPICS
        )
        assert await executor.claim(call, "acme") is not None  # the worker dies here
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls).values(lease_expires_at=text("now() - interval '1 second'"))
        )
    report = await recover_expired(sessions, registry, topics=DEFAULT_TOPICS)
    assert report.redispatched == [call]
    return call


Writer = Callable[[Sessions, CapabilityRegistry], Awaitable[str]]

# The writer, the event that causes its command, and the producer it publishes as.
WRITERS: dict[str, tuple[Writer, str, str]] = {
    "intake": (by_intake, "tool.call.authorized", "tool-dispatcher.intake"),
    "approval": (by_approval, "approval.granted", "tool-dispatcher.approvals"),
    "retry": (by_retry, "tool.call.retried", "tool-dispatcher.operator"),
    "redrive": (by_redrive, "tool.call.redriven", "tool-dispatcher.redrive"),
    "recovery": (by_recovery, "tool.call.redispatched", "tool-dispatcher.recovery"),
}


async def newest_command(sessions: Sessions, call: str) -> Any:
    async with sessions() as session:
        return (
            await session.execute(
                select(outbox.c.payload, outbox.c.headers)
                .where(
                    outbox.c.topic == DEFAULT_TOPICS.dispatch,
                    outbox.c.key == ordering_key("acme", call),
                )
                .order_by(outbox.c.id.desc())
                .limit(1)
            )
        ).one()


async def events_of(sessions: Sessions, call: str, event_type: str) -> list[Any]:
    async with sessions() as session:
        return list(
            await session.execute(
                select(execution_events.c.event_id, execution_events.c.producer).where(
                    execution_events.c.tool_call_id == call,
                    execution_events.c.event_type == event_type,
                )
            )
        )


@pytest.mark.parametrize("writer", list(WRITERS))
async def test_a_dispatch_command_names_its_writer_and_the_event_that_caused_it(
    sessions: Sessions, registry: CapabilityRegistry, writer: str
) -> None:
    drive, cause_type, producer = WRITERS[writer]
    call = await drive(sessions, registry)

    command = await newest_command(sessions, call)
    [cause] = await events_of(sessions, call, cause_type)
    assert command.payload["causationId"] == cause.event_id
    assert command.headers["ce_source"] == f"/tool-dispatcher/{producer}"
    # The command and its cause come from one writer.
    assert cause.producer == producer


async def test_a_mover_gets_back_the_events_it_recorded(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    one, two, three = [await submit_call(sessions, registry, "refund", {"n": n}) for n in range(3)]
    cancel: dict[str, Any] = {
        "expected": S.AUTHORIZED,
        "target": S.CANCELLED,
        "event_type": EventType.TOOL_CALL_CANCELLED,
        "producer": Producer.OPERATOR,
    }
    async with sessions() as session, session.begin():
        moved = [
            await move(session, one, tenant="acme", **cancel),
            *await move_many(
                session,
                [BulkMove(two, tenant="acme"), BulkMove(three, tenant="acme")],
                lease_owner=None,
                **cancel,
            ),
        ]

    assert sorted(m.row.tool_call_id for m in moved) == sorted([one, two, three])
    for m in moved:
        [stored] = await events_of(sessions, m.row.tool_call_id, "tool.call.cancelled")
        assert m.event_id == stored.event_id
        assert m.event["tool_call_id"] == m.row.tool_call_id
