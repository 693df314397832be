"""Re-driving authorized calls whose dispatch command the broker lost: on real
PostgreSQL, and end to end with real relay and worker processes on a real broker. Which
authorized calls one redrive takes, and that it reads and writes the topics it is given."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry, load_registry
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.ledger.messages import Producer, ce_source, enqueue, outbox_row
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.tenancy import ordering_key
from dispatcher.worker import redrive as redrive_module
from dispatcher.worker.redrive import redrive_stale
from tests.fixtures.calls import insert_call, submit_call
from tests.fixtures.rows import call_row, event_types, outbox_rows
from tests.fixtures.sandbox import at_provider, books
from tests.fixtures.stack import MakeStack
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres

TOPIC = DEFAULT_TOPICS.dispatch
Sessions = async_sessionmaker[AsyncSession]
# Topics of this deployment's own: redrive must read and write where it is told to.
SITE_TOPICS = Topics(dispatch="site.commands", events="site.events", escalations="site.escalations")


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(capability("refund", sandbox.url))


async def lose_commands(sessions: async_sessionmaker[AsyncSession], *, age: float) -> None:
    """What a broker restart leaves: the commands were published (the relay marked
    them), the broker forgot them, and the calls have been authorized for ``age`` s."""
    back = text(f"now() - interval '{age} seconds'")
    async with sessions() as session, session.begin():
        await session.execute(update(outbox).values(published_at=back, created_at=back))
        await session.execute(update(tool_calls).values(updated_at=back, created_at=back))


async def dispatch_rows(sessions: async_sessionmaker[AsyncSession], call: str) -> int:
    async with sessions() as session:
        count: int = (
            await session.execute(
                select(func.count())
                .select_from(outbox)
                .where(outbox.c.key == ordering_key("acme", call), outbox.c.topic == TOPIC)
            )
        ).scalar_one()
    return count


async def redrive_facts(
    sessions: async_sessionmaker[AsyncSession], call: str
) -> list[tuple[str, dict[str, object]]]:
    """Each ``tool.call.redriven`` event of ``call`` with the causation id of the dispatch
    command written after it, oldest first."""
    async with sessions() as session:
        events = (
            await session.execute(
                select(execution_events.c.event_id, execution_events.c.payload)
                .where(
                    execution_events.c.tool_call_id == call,
                    execution_events.c.event_type == "tool.call.redriven",
                )
                .order_by(execution_events.c.seq)
            )
        ).all()
        causes = (
            await session.execute(
                select(outbox.c.payload["causationId"].astext)
                .where(outbox.c.key == ordering_key("acme", call), outbox.c.topic == TOPIC)
                .order_by(outbox.c.id)
            )
        ).scalars()
    # The first command is intake's; each later one names the redrive that wrote it.
    assert list(causes)[1:] == [e.event_id for e in events]
    return [(e.event_id, e.payload) for e in events]


async def redrive(sessions: async_sessionmaker[AsyncSession], **kw: object) -> list[str]:
    return await redrive_stale(
        sessions,
        topics=DEFAULT_TOPICS,
        older_than_seconds=60,
        **kw,  # type: ignore[arg-type]
    )


async def test_lost_command_is_written_again_once_per_threshold(
    sessions: async_sessionmaker[AsyncSession], registry: CapabilityRegistry
) -> None:
    call = await submit_call(sessions, registry, "refund", {"orderId": "o-1"})
    await lose_commands(sessions, age=120)

    assert await redrive(sessions) == [call]
    assert await dispatch_rows(sessions, call) == 2
    [(_, fact)] = await redrive_facts(sessions, call)
    assert fact["thresholdSeconds"] == 60 and isinstance(fact["authorizedSince"], str)
    # The fresh command is unpublished, then young: either way no second one.
    assert await redrive(sessions) == []
    async with sessions() as session, session.begin():
        await session.execute(update(outbox).values(published_at=func.now()))
    assert await redrive(sessions) == []
    assert await dispatch_rows(sessions, call) == 2
    # Lost again, a threshold later: written again.
    await lose_commands(sessions, age=120)
    assert await redrive(sessions) == [call]
    assert len(await redrive_facts(sessions, call)) == 2
    # A fact, not a transition: the call still waits in authorized for a worker.
    assert (await call_row(sessions, call))["status"] == "authorized"


async def test_young_waiting_or_unknown_calls_are_left_alone(
    sessions: async_sessionmaker[AsyncSession], registry: CapabilityRegistry
) -> None:
    young = await submit_call(sessions, registry, "refund", {"orderId": "o-1"})
    assert await redrive(sessions) == []  # authorized just now, its command unpublished

    async with sessions() as session, session.begin():
        # Old, but its command is still waiting for the relay.
        await session.execute(
            update(tool_calls).values(updated_at=text("now() - interval '10 minutes'"))
        )
    assert await redrive(sessions) == []

    await lose_commands(sessions, age=120)
    # A capability no worker knows: re-emitting would only repeat the refusal.
    assert await redrive(sessions, known_capabilities={"other"}) == []
    assert await redrive(sessions, known_capabilities={"refund"}) == [young]


async def test_concurrent_redrivers_write_one_command(
    sessions: async_sessionmaker[AsyncSession], registry: CapabilityRegistry
) -> None:
    calls = [
        await submit_call(sessions, registry, "refund", {"orderId": f"o-{i}"}) for i in range(20)
    ]
    await lose_commands(sessions, age=120)
    results = await asyncio.gather(*(redrive(sessions) for _ in range(4)))
    assert sorted(c for r in results for c in r) == sorted(calls)
    for call in calls:
        assert await dispatch_rows(sessions, call) == 2
        assert len(await redrive_facts(sessions, call)) == 1


async def test_claimed_call_is_not_redriven(
    sessions: async_sessionmaker[AsyncSession], registry: CapabilityRegistry
) -> None:
    await submit_call(sessions, registry, "refund", {"orderId": "o-1"})
    await lose_commands(sessions, age=120)
    async with sessions() as session, session.begin():
        await session.execute(update(tool_calls).values(status="dispatching"))
    assert await redrive(sessions) == []


@pytest.mark.kafka
@pytest.mark.slow
async def test_worker_redrives_lost_commands_and_applies_each_once(
    make_stack: MakeStack, sessions: async_sessionmaker[AsyncSession], sandbox: SandboxServer
) -> None:
    """Commands lost with the broker's memory are re-emitted by a worker's sweep, and
    the duplicates that two re-drives produce are dropped by the call's state."""
    stack = make_stack(
        sandbox_url=sandbox.url, redrive_after_seconds=1, redrive_interval_seconds=0.2
    )
    registry = load_registry(Path(stack.env["TOOL_DISPATCHER_CAPABILITIES_FILE"]))
    calls = [
        await submit_call(
            sessions, registry, "refund", {"orderId": f"o-{i}"}, key=f"k-{i}", topics=stack.topics
        )
        for i in range(10)
    ]
    async with sessions() as session, session.begin():
        # Marked published but never sent: exactly what a broker restart leaves behind.
        await session.execute(update(outbox).values(published_at=func.now()))
        # Two commands for half the calls, as overlapping re-drives would give.
        for call in calls[:5] * 2:
            await session.execute(
                text(
                    "INSERT INTO outbox (topic, key, payload, headers) "
                    "SELECT topic, key, payload, headers FROM outbox "
                    "WHERE key = :k AND published_at IS NOT NULL"
                ),
                {"k": ordering_key("acme", call)},
            )
    stack.start("relay")
    stack.start("worker")
    stack.start("worker")

    async def all_completed() -> bool:
        rows = [await call_row(sessions, c) for c in calls]
        return all(r["status"] == "completed" for r in rows)

    await eventually(all_completed, what="the re-driven calls to complete")
    assert (await books(sandbox.url))["effects"] == {at_provider(f"k-{i}"): 1 for i in range(10)}


async def test_a_call_whose_command_cannot_be_built_does_not_hold_back_the_others(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = [await submit_call(sessions, registry, "refund", {"n": i}) for i in range(3)]
    await lose_commands(sessions, age=120)
    bad = calls[1]
    build = redrive_module.event_row

    def event_row(*args: Any, **kwargs: Any) -> dict[str, Any]:
        # A row the builder chokes on (the database, the broker and HTTP stay real).
        context = args[1]
        if context.tool_call_id == bad:
            raise ValueError("cannot build")
        return build(*args, **kwargs)

    monkeypatch.setattr(redrive_module, "event_row", event_row)

    redriven = await redrive_stale(sessions, topics=DEFAULT_TOPICS, older_than_seconds=60)

    assert sorted(redriven) == sorted([calls[0], calls[2]])
    assert [await dispatch_rows(sessions, call) for call in calls] == [2, 1, 2]
    assert (await call_row(sessions, bad))["status"] == "authorized"  # due at the next sweep


async def test_a_redriven_command_carries_the_calls_stored_trace_context(
    sessions: async_sessionmaker[AsyncSession], registry: CapabilityRegistry
) -> None:
    """The worker's span continues the message's context: a re-driven command names the
    call's stored one, so the re-sent call stays in its trace."""
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    call = await submit_call(sessions, registry, "refund", {"orderId": "o-traced"})
    async with sessions() as session, session.begin():
        await session.execute(update(tool_calls).values(traceparent=parent))
    await lose_commands(sessions, age=120)
    assert await redrive(sessions) == [call]
    async with sessions() as session:
        headers = (
            await session.execute(
                select(outbox.c.headers)
                .where(outbox.c.key == ordering_key("acme", call), outbox.c.topic == TOPIC)
                .order_by(outbox.c.id)
            )
        ).scalars()
    assert [h.get("traceparent") for h in headers] == [None, parent]


async def authorized(sessions: Sessions, seconds_ago: int) -> str:
    """An authorized call with no dispatch command at all, authorized ``seconds_ago``."""
    return await insert_call(
        sessions,
        "authorized",
        cap_id="refund",
        updated_at=text(f"now() - interval '{seconds_ago} seconds'"),
    )


async def redrive_to_site(sessions: Sessions, **kw: int) -> list[str]:
    return await redrive_stale(sessions, topics=SITE_TOPICS, older_than_seconds=60, **kw)


async def test_a_stale_call_gets_a_command_from_the_redriver_on_its_topics(
    sessions: Sessions,
) -> None:
    call = await authorized(sessions, 120)
    young = await authorized(sessions, 5)

    assert await redrive_to_site(sessions) == [call]

    [command] = await outbox_rows(sessions, SITE_TOPICS.dispatch)
    assert command["key"] == ordering_key("acme", call)
    assert command["headers"]["ce_source"] == ce_source(Producer.REDRIVE)
    assert [r["key"] for r in await outbox_rows(sessions, SITE_TOPICS.events)] == [
        ordering_key("acme", "run-1")
    ]
    assert (await event_types(sessions, call))[-1] == "tool.call.redriven"
    assert await event_types(sessions, young) == []


async def test_only_a_command_on_the_dispatch_topic_counts_as_one_in_flight(
    sessions: Sessions,
) -> None:
    call = await authorized(sessions, 120)
    other = outbox_row(
        topic="site.audit",
        key=ordering_key("acme", call),
        type="x",
        source="/x",
        payload={"tenant": "acme"},
    )
    async with sessions() as session, session.begin():
        await enqueue(session, [other])

    assert await redrive_to_site(sessions) == [call]


async def test_one_redrive_takes_at_most_its_limit(sessions: Sessions) -> None:
    calls = {await authorized(sessions, 120), await authorized(sessions, 90)}
    first = await redrive_to_site(sessions, limit=1)
    assert len(first) == 1
    assert set(first + await redrive_to_site(sessions)) == calls
