"""The batch movers' statements read each event's row from its published form and
keep that form as its message's payload, the routed moves build it in SQL
(``envelope_sql``), the single-call path in Python (``event_message``): the bus must
not tell them apart. Every
field of every message a batch wrote equals what ``event_message`` makes of its event,
the messages are in the events' order, and both leave out the same events, those of
the log-only types (``LOG_ONLY``), which are logged all the same (real PostgreSQL)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import execution_events, outbox
from dispatcher.ledger.batched import record_all
from dispatcher.ledger.events import (
    LOG_ONLY,
    CallContext,
    EventType,
    event_message,
    event_row,
    record_events,
)
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.routed import Route, RoutedMove, move_each
from dispatcher.ledger.transitions import BulkMove, Moved, move_many
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from outbox_relay.table import notify_channel
from tests.fixtures.calls import insert_call

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
TOPICS = Topics(events="td.batch-messages.events")


def ids(moved: Sequence[Moved]) -> list[str]:
    return [m.event_id for m in moved]


async def published(sessions: Sessions, event_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The outbox rows of the events ``event_ids``, in the outbox's order."""
    async with sessions() as session:
        rows = await session.execute(
            select(outbox.c.topic, outbox.c.key, outbox.c.payload, outbox.c.headers)
            .where(outbox.c.headers["ce_id"].astext.in_(event_ids))
            .order_by(outbox.c.id)
        )
        return [dict(r._mapping) for r in rows]


def expected(moved: Sequence[Moved]) -> list[dict[str, Any]]:
    return [event_message(m.event, TOPICS) for m in moved]


async def logged(sessions: Sessions, event_ids: Sequence[str]) -> list[str]:
    """Those of the events ``event_ids`` that are in the log, in the log's order."""
    async with sessions() as session:
        rows = await session.execute(
            select(execution_events.c.event_id)
            .where(execution_events.c.event_id.in_(event_ids))
            .order_by(execution_events.c.seq)
        )
        return [r[0] for r in rows]


async def _move_three(
    sessions: Sessions, expected_: S, target: S, event_type: EventType, cap_id: str
) -> list[Moved]:
    """Three calls inserted in ``expected_``, moved together to ``target``."""
    calls = [
        await insert_call(sessions, expected_.value, cap_id=cap_id, run_id=f"run-{i}")
        for i in range(3)
    ]
    async with sessions() as session, session.begin():
        return await move_many(
            session,
            [BulkMove(call, payload={"n": i}, tenant="acme") for i, call in enumerate(calls)],
            expected=expected_,
            target=target,
            event_type=event_type,
            producer=Producer.WORKER,
            lease_owner=None,
            topics=TOPICS,
        )


async def test_a_batchs_messages_are_its_events_as_event_message_makes_them(
    sessions: Sessions,
) -> None:
    moved = await _move_three(
        sessions, S.DISPATCHING, S.COMPLETED, EventType.TOOL_CALL_COMPLETED, "bm-batch"
    )
    assert len(moved) == 3
    assert await published(sessions, ids(moved)) == expected(moved)


async def test_a_batch_of_claims_is_logged_and_not_published(sessions: Sessions) -> None:
    """``tool.call.dispatching`` is log-only (``LOG_ONLY``): the claim's statement writes
    each claim's event and no message for it."""
    moved = await _move_three(
        sessions, S.AUTHORIZED, S.DISPATCHING, EventType.TOOL_CALL_DISPATCHING, "bm-claim"
    )
    assert len(moved) == 3
    assert sorted(await logged(sessions, ids(moved))) == sorted(ids(moved))
    assert await published(sessions, ids(moved)) == []


def _mixed(calls: Sequence[str]) -> list[dict[str, Any]]:
    """Events of log-only and published types, interleaved, one per call."""
    types = [EventType.TOOL_CALL_DISPATCHING, EventType.TOOL_CALL_COMPLETED]
    return [
        event_row(
            types[i % 2],
            CallContext(tenant="acme", run_id="run-mixed", tool_call_id=call, capability_id="bm"),
            producer=Producer.WORKER,
            payload={"n": i},
        )
        for i, call in enumerate(calls)
    ]


@pytest.mark.parametrize("writer", ["record_all", "record_events"])
async def test_both_writers_log_every_event_and_publish_all_but_the_log_only_ones(
    sessions: Sessions, writer: str
) -> None:
    """The batch statement filters in SQL what the single-event path filters in Python:
    both log every event and publish the same messages, in the events' order."""
    calls = [
        await insert_call(sessions, "dispatching", cap_id="bm", run_id="run-mixed")
        for _ in range(4)
    ]
    events = _mixed(calls)
    async with sessions() as session, session.begin():
        if writer == "record_all":
            await record_all(session, events, TOPICS)
        else:
            await record_events(session, events, topics=TOPICS)
    written = [e["event_id"] for e in events]
    assert await logged(sessions, written) == written
    kept = [e for e in events if e["event_type"] not in LOG_ONLY]
    assert [e["event_type"] for e in kept] == ["tool.call.completed"] * 2
    assert await published(sessions, written) == [event_message(e, TOPICS) for e in kept]


async def _move_routed(
    sessions: Sessions,
    targets: Sequence[tuple[str, S]],
    expected_: S,
    routes: dict[S, Route],
    context: CallContext,
) -> list[Moved]:
    """Each ``(call, target)`` moved by one routed statement, with ``context``'s ids."""
    moves = [
        RoutedMove(
            BulkMove(call, tenant="acme"), target, dataclasses.replace(context, tool_call_id=call)
        )
        for call, target in targets
    ]
    async with sessions() as session, session.begin():
        return await move_each(
            session,
            moves,
            expected=expected_,
            routes=routes,
            producer=Producer.WORKER,
            lease_owner=None,
            topics=TOPICS,
        )


async def test_a_routed_batchs_messages_are_those_of_the_events_it_kept(
    sessions: Sessions,
) -> None:
    ok = await insert_call(sessions, "dispatching", cap_id="bm-routed")
    bad = await insert_call(sessions, "dispatching", cap_id="bm-routed")
    context = CallContext(
        tenant="acme",
        run_id="run-routed",
        tool_call_id="",
        capability_id="bm-routed",
        turn_id="turn-7",
        correlation_id="corr-1",
    )
    moved = await _move_routed(
        sessions,
        [(ok, S.COMPLETED), (bad, S.FAILED)],
        S.DISPATCHING,
        {
            S.COMPLETED: Route(EventType.TOOL_CALL_COMPLETED),
            S.FAILED: Route(EventType.TOOL_CALL_FAILED),
        },
        context,
    )
    assert {m.event["event_type"] for m in moved} == {"tool.call.completed", "tool.call.failed"}
    assert await published(sessions, ids(moved)) == expected(
        sorted(moved, key=lambda m: (m.row.tenant, m.row.tool_call_id))
    )


async def test_a_routed_batch_logs_a_log_only_event_and_publishes_the_others(
    sessions: Sessions,
) -> None:
    claimed = await insert_call(sessions, "authorized", cap_id="bm-routed-claim")
    cancelled = await insert_call(sessions, "authorized", cap_id="bm-routed-claim")
    context = CallContext(
        tenant="acme", run_id="run-1", tool_call_id="", capability_id="bm-routed-claim"
    )
    moved = await _move_routed(
        sessions,
        [(claimed, S.DISPATCHING), (cancelled, S.CANCELLED)],
        S.AUTHORIZED,
        {
            S.DISPATCHING: Route(EventType.TOOL_CALL_DISPATCHING),
            S.CANCELLED: Route(EventType.TOOL_CALL_CANCELLED),
        },
        context,
    )
    assert len(moved) == 2
    assert sorted(await logged(sessions, ids(moved))) == sorted(ids(moved))
    assert await published(sessions, ids(moved)) == expected(
        [m for m in moved if m.event["event_type"] == "tool.call.cancelled"]
    )


async def test_a_batch_of_claims_wakes_no_relay(sessions: Sessions, database_url: str) -> None:
    """A batch with no published event inserts into the log alone: an INSERT of no row
    into the outbox would still fire its statement trigger, and every relay would wake
    at commit to find nothing new. A batch with one does wake them (the control)."""
    claimed = await insert_call(sessions, "authorized", cap_id="bm-wake")
    done = await insert_call(sessions, "dispatching", cap_id="bm-wake")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as listener:
        # As an idle relay does: writers notify only while one listens.
        await listener.execute(
            "INSERT INTO outbox_listeners VALUES ('test', now() + interval '1 minute')"
        )
        await listener.execute(f"LISTEN {notify_channel('outbox')}")
        for call, expected, target, event_type in (
            (claimed, S.AUTHORIZED, S.DISPATCHING, EventType.TOOL_CALL_DISPATCHING),
            (done, S.DISPATCHING, S.COMPLETED, EventType.TOOL_CALL_COMPLETED),
        ):
            async with sessions() as session, session.begin():
                await move_many(
                    session,
                    [BulkMove(call, tenant="acme")],
                    expected=expected,
                    target=target,
                    event_type=event_type,
                    producer=Producer.WORKER,
                    lease_owner=None,
                    topics=TOPICS,
                )
            woken = [n async for n in listener.notifies(timeout=1.0)]
            assert len(woken) == (event_type not in LOG_ONLY), event_type
