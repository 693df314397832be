"""``dispatcher.ledger.transitions.move`` against PostgreSQL: a state change and its event are
one transaction, and a stale mover (wrong state, lease or version) changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.errors import IllegalTransition, TransitionConflict
from dispatcher.intake.service import submit
from dispatcher.ledger.events import EventType
from dispatcher.ledger.transitions import Fence, move
from dispatcher.schemas import SubmitRequest
from dispatcher.states import ExecutionStatus

pytestmark = pytest.mark.postgres

S = ExecutionStatus
Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
async def call_id(sessions: Sessions, registry: CapabilityRegistry) -> str:
    """A committed call in ``authorized`` (version 1)."""
    async with sessions() as session, session.begin():
        submission = await submit(
            session,
            SubmitRequest(
                run_id="run-1",
                turn_id="turn-1",
                capability_id="send-email",
                input={"to": "ada@example.com"},
                correlation_id="corr-1",
            ),
            tenant="acme",
            registry=registry,
        )
    return submission.view.tool_call_id


async def _row(sessions: Sessions, tool_call_id: str) -> dict[str, Any]:
    async with sessions() as session:
        row = (
            await session.execute(
                select(tool_calls).where(tool_calls.c.tool_call_id == tool_call_id)
            )
        ).one()
    return dict(row._mapping)


async def _events(sessions: Sessions, tool_call_id: str) -> list[dict[str, Any]]:
    async with sessions() as session:
        rows = await session.execute(
            select(execution_events)
            .where(execution_events.c.tool_call_id == tool_call_id)
            .order_by(execution_events.c.seq)
        )
    return [dict(r._mapping) for r in rows]


async def _snapshot(sessions: Sessions) -> dict[str, list[dict[str, Any]]]:
    """Everything a move could write: calls, events, outbox messages."""
    async with sessions() as session:
        return {
            table.name: [dict(r._mapping) for r in await session.execute(select(table))]
            for table in (tool_calls, execution_events, outbox)
        }


async def _dispatch(
    sessions: Sessions, tool_call_id: str, *, owner: str = "worker-1", **kwargs: Any
) -> Any:
    async with sessions() as session, session.begin():
        moved = await move(
            session,
            tool_call_id,
            tenant="acme",
            expected=S.AUTHORIZED,
            target=S.DISPATCHING,
            event_type=EventType.TOOL_CALL_DISPATCHING,
            producer="tool-dispatcher.worker",
            fields={"lease_owner": owner},
            **kwargs,
        )
    return moved.row


async def test_move_changes_status_and_records_one_event(sessions: Sessions, call_id: str) -> None:
    before = await _events(sessions, call_id)

    returned = await _dispatch(sessions, call_id, causation_id="evt_cause", payload={"n": 1})

    row = await _row(sessions, call_id)
    assert row["status"] == "dispatching"
    assert row["lease_owner"] == "worker-1"
    assert row["version"] == 2
    assert returned.status == "dispatching" and returned.version == 2
    after = await _events(sessions, call_id)
    assert len(after) == len(before) + 1
    event = after[-1]
    assert event["event_type"] == "tool.call.dispatching"
    assert event["producer"] == "tool-dispatcher.worker"
    assert event["causation_id"] == "evt_cause"
    assert (event["tenant"], event["run_id"], event["turn_id"]) == ("acme", "run-1", "turn-1")
    assert event["capability_id"] == "send-email"
    assert event["correlation_id"] == "corr-1"
    assert event["payload"] == {"from": ["authorized"], "to": "dispatching", "n": 1}


async def _messages_of(sessions: Sessions, event_ids: list[str]) -> list[str]:
    """The ce_type of each outbox row of the events ``event_ids``."""
    async with sessions() as session:
        rows = await session.execute(
            select(outbox.c.headers["ce_type"].astext).where(
                outbox.c.headers["ce_id"].astext.in_(event_ids)
            )
        )
    return [r[0] for r in rows]


async def test_a_claim_moved_alone_is_logged_but_not_published_and_its_outcome_is_both(
    sessions: Sessions, call_id: str
) -> None:
    """The single-call path (``record_events``) leaves the claim's event out of the
    outbox (``LOG_ONLY``) as the batch statement does, and publishes the outcome's."""
    await _dispatch(sessions, call_id)
    async with sessions() as session, session.begin():
        await move(
            session,
            call_id,
            tenant="acme",
            expected=S.DISPATCHING,
            target=S.COMPLETED,
            event_type=EventType.TOOL_CALL_COMPLETED,
            producer="tool-dispatcher.worker",
            fence=Fence(owner="worker-1"),
        )
    events = {e["event_type"]: e["event_id"] for e in await _events(sessions, call_id)}
    assert await _messages_of(sessions, [events["tool.call.dispatching"]]) == []
    assert await _messages_of(sessions, [events["tool.call.completed"]]) == ["tool.call.completed"]


async def test_rolled_back_move_leaves_neither_state_nor_event(
    sessions: Sessions, call_id: str
) -> None:
    before = await _snapshot(sessions)

    async with sessions() as session:
        async with session.begin():
            await move(
                session,
                call_id,
                tenant="acme",
                expected=S.AUTHORIZED,
                target=S.DISPATCHING,
                event_type=EventType.TOOL_CALL_DISPATCHING,
                producer="tool-dispatcher.worker",
            )
            await session.rollback()

    assert await _snapshot(sessions) == before


async def test_illegal_move_raises_and_writes_nothing(sessions: Sessions, call_id: str) -> None:
    before = await _snapshot(sessions)

    async with sessions() as session, session.begin():
        with pytest.raises(IllegalTransition):
            await move(
                session,
                call_id,
                tenant="acme",
                expected=S.AUTHORIZED,
                target=S.COMPLETED,
                event_type=EventType.TOOL_CALL_COMPLETED,
                producer="tool-dispatcher.worker",
            )
        # One illegal source among legal ones is refused as a whole.
        with pytest.raises(IllegalTransition):
            await move(
                session,
                call_id,
                tenant="acme",
                expected=[S.DISPATCHING, S.AUTHORIZED],
                target=S.COMPLETED,
                event_type=EventType.TOOL_CALL_COMPLETED,
                producer="tool-dispatcher.worker",
            )

    assert await _snapshot(sessions) == before


async def test_move_from_a_state_the_call_is_not_in_conflicts(
    sessions: Sessions, call_id: str
) -> None:
    before = await _snapshot(sessions)

    async with sessions() as session, session.begin():
        with pytest.raises(TransitionConflict) as info:
            await move(
                session,
                call_id,
                tenant="acme",
                expected=S.DISPATCHING,
                target=S.COMPLETED,
                event_type=EventType.TOOL_CALL_COMPLETED,
                producer="tool-dispatcher.worker",
            )

    assert info.value.retriable is True
    assert info.value.extra == {"toolCallId": call_id, "target": "completed"}
    assert await _snapshot(sessions) == before


async def test_move_of_an_unknown_call_conflicts(sessions: Sessions) -> None:
    async with sessions() as session, session.begin():
        with pytest.raises(TransitionConflict):
            await move(
                session,
                "no-such-call",
                tenant="acme",
                expected=S.AUTHORIZED,
                target=S.DISPATCHING,
                event_type=EventType.TOOL_CALL_DISPATCHING,
                producer="tool-dispatcher.worker",
            )
    async with sessions() as session:
        count = await session.scalar(select(func.count()).select_from(execution_events))
    assert count == 0


async def _complete(sessions: Sessions, tool_call_id: str, **fence: Any) -> Any:
    async with sessions() as session, session.begin():
        moved = await move(
            session,
            tool_call_id,
            tenant="acme",
            expected=S.DISPATCHING,
            target=S.COMPLETED,
            event_type=EventType.TOOL_CALL_COMPLETED,
            producer="tool-dispatcher.worker",
            fields={"lease_owner": None},
            fence=Fence(**fence),
        )
    return moved.row


async def test_lease_owner_fences_out_a_worker_whose_claim_was_taken(
    sessions: Sessions, call_id: str
) -> None:
    await _dispatch(sessions, call_id, owner="worker-1")
    before = await _snapshot(sessions)

    with pytest.raises(TransitionConflict):
        await _complete(sessions, call_id, owner="worker-2")
    assert await _snapshot(sessions) == before

    row = await _complete(sessions, call_id, owner="worker-1")
    assert row.status == "completed"
    assert row.lease_owner is None


async def test_version_fences_out_a_stale_reader(sessions: Sessions, call_id: str) -> None:
    stale = (await _row(sessions, call_id))["version"]
    await _dispatch(sessions, call_id)
    before = await _snapshot(sessions)

    with pytest.raises(TransitionConflict):
        await _complete(sessions, call_id, version=stale)
    assert await _snapshot(sessions) == before

    current = (await _row(sessions, call_id))["version"]
    row = await _complete(sessions, call_id, version=current)
    assert row.version == current + 1


async def test_each_move_increments_the_version(sessions: Sessions, call_id: str) -> None:
    versions = [(await _row(sessions, call_id))["version"]]
    versions.append((await _dispatch(sessions, call_id)).version)
    versions.append((await _complete(sessions, call_id)).version)
    assert versions == [1, 2, 3]
    assert (await _row(sessions, call_id))["version"] == 3


async def test_a_mover_blocked_on_the_row_lock_loses_when_the_holder_commits(
    sessions: Sessions, call_id: str
) -> None:
    first_updated = asyncio.Event()
    seen_waiting: list[bool] = []

    async def waiter_blocked() -> bool:
        """Whether another backend of this database waits on a lock (the second mover's
        UPDATE on our row), asked for up to 10 s: on a loaded machine its session may
        take a while to send the UPDATE at all."""
        async with sessions() as probe:
            for _ in range(200):
                waiting = await probe.scalar(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()"
                    )
                )
                if waiting:
                    return True
                # A transaction reads pg_stat_activity once, at its first look: end it,
                # or every later look sees the backends as they were then.
                await probe.rollback()
                await asyncio.sleep(0.05)
        return False

    async def first() -> Any:
        async with sessions() as session:
            async with session.begin():
                row = await move(
                    session,
                    call_id,
                    tenant="acme",
                    expected=S.AUTHORIZED,
                    target=S.DISPATCHING,
                    event_type=EventType.TOOL_CALL_DISPATCHING,
                    producer="tool-dispatcher.worker",
                    fields={"lease_owner": "worker-1"},
                )
                first_updated.set()
                # Commit only once the second mover's UPDATE waits on our row's lock.
                seen_waiting.append(await waiter_blocked())
            return row

    async def second() -> Any:
        await first_updated.wait()
        return await _dispatch(sessions, call_id, owner="worker-2")

    results = await asyncio.gather(first(), second(), return_exceptions=True)

    # Its UPDATE could only finish after the first transaction let go of the row.
    assert seen_waiting == [True]
    winner, loser = results
    assert not isinstance(winner, BaseException)
    assert winner.row.lease_owner == "worker-1"
    assert isinstance(loser, TransitionConflict)
    row = await _row(sessions, call_id)
    assert (row["status"], row["lease_owner"], row["version"]) == ("dispatching", "worker-1", 2)
    dispatching = [
        e for e in await _events(sessions, call_id) if e["event_type"] == "tool.call.dispatching"
    ]
    assert [e["producer"] for e in dispatching] == ["tool-dispatcher.worker"]


async def test_concurrent_movers_exactly_one_wins(sessions: Sessions, call_id: str) -> None:
    workers = [f"worker-{n}" for n in range(8)]
    results = await asyncio.gather(
        *(_dispatch(sessions, call_id, owner=w) for w in workers), return_exceptions=True
    )

    winners = [r for r in results if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(r, TransitionConflict) for r in losers), losers
    row = await _row(sessions, call_id)
    assert row["lease_owner"] == winners[0].lease_owner
    assert row["version"] == 2
    dispatching = [
        e for e in await _events(sessions, call_id) if e["event_type"] == "tool.call.dispatching"
    ]
    assert len(dispatching) == 1
