"""The batch movers build each event's outbox row in SQL (``envelope_sql``), the
single-call path in Python (``event_message``): the bus must not tell them apart. Every
field of every message a batch wrote equals what ``event_message`` makes of its event,
and the messages are in the events' order (real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import outbox
from dispatcher.ledger.events import CallContext, EventType, event_message
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.routed import Route, RoutedMove, move_each
from dispatcher.ledger.transitions import BulkMove, Moved, move_many
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from tests.fixtures.calls import insert_call

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
TOPICS = Topics(events="td.batch-messages.events")


async def published(sessions: Sessions, moved: Sequence[Moved]) -> list[dict[str, Any]]:
    ids = [m.event_id for m in moved]
    async with sessions() as session:
        rows = await session.execute(
            select(outbox.c.topic, outbox.c.key, outbox.c.payload, outbox.c.headers)
            .where(outbox.c.headers["ce_id"].astext.in_(ids))
            .order_by(outbox.c.id)
        )
        return [dict(r._mapping) for r in rows]


def expected(moved: Sequence[Moved]) -> list[dict[str, Any]]:
    return [event_message(m.event, TOPICS) for m in moved]


async def test_a_claims_messages_are_its_events_as_event_message_makes_them(
    sessions: Sessions,
) -> None:
    calls = [
        await insert_call(sessions, "authorized", cap_id="bm-claim", run_id=f"run-{i}")
        for i in range(3)
    ]
    async with sessions() as session, session.begin():
        moved = await move_many(
            session,
            [BulkMove(call, payload={"n": i}, tenant="acme") for i, call in enumerate(calls)],
            expected=S.AUTHORIZED,
            target=S.DISPATCHING,
            event_type=EventType.TOOL_CALL_DISPATCHING,
            producer=Producer.WORKER,
            lease_owner=None,
            topics=TOPICS,
        )
    assert len(moved) == 3
    assert await published(sessions, moved) == expected(moved)


async def test_a_routed_batchs_messages_are_those_of_the_events_it_kept(
    sessions: Sessions,
) -> None:
    ok = await insert_call(sessions, "dispatching", cap_id="bm-routed")
    bad = await insert_call(sessions, "dispatching", cap_id="bm-routed")

    def routed(call: str, target: S) -> RoutedMove:
        context = CallContext(
            tenant="acme",
            run_id="run-routed",
            tool_call_id=call,
            capability_id="bm-routed",
            turn_id="turn-7",
            correlation_id="corr-1",
        )
        return RoutedMove(BulkMove(call, tenant="acme"), target, context)

    async with sessions() as session, session.begin():
        moved = await move_each(
            session,
            [routed(ok, S.COMPLETED), routed(bad, S.FAILED)],
            expected=S.DISPATCHING,
            routes={
                S.COMPLETED: Route(EventType.TOOL_CALL_COMPLETED),
                S.FAILED: Route(EventType.TOOL_CALL_FAILED),
            },
            producer=Producer.WORKER,
            lease_owner=None,
            topics=TOPICS,
        )
    assert {m.event["event_type"] for m in moved} == {"tool.call.completed", "tool.call.failed"}
    assert await published(sessions, moved) == expected(
        sorted(moved, key=lambda m: (m.row.tenant, m.row.tool_call_id))
    )
