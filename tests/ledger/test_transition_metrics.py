"""``tool_dispatcher_transitions_total`` counts what the ledger's three movers moved
(``move``, ``move_many``, ``move_each``): by the status each call left and reached and
by its capability, never what was only asked for. Real PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.errors import TransitionConflict
from dispatcher.ledger.events import CallContext, EventType
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.routed import Route, RoutedMove, move_each
from dispatcher.ledger.transitions import BulkMove, move, move_many
from dispatcher.states import ExecutionStatus as S
from tests.fixtures.calls import insert_call
from tests.fixtures.metrics import sample

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("labels_stay_bounded")]

Sessions = async_sessionmaker[AsyncSession]


MOVES = "tool_dispatcher_transitions_total"


def moves(came_from: str, to: str, capability: str) -> float:
    return sample(MOVES, **{"from": came_from, "to": to, "capability": capability})


async def test_a_move_is_counted_once_and_a_refused_one_not_at_all(sessions: Sessions) -> None:
    call = await insert_call(sessions, "result_unknown", cap_id="m-send")
    before = moves("result_unknown", "confirmed", "m-send")

    async def confirm() -> None:
        async with sessions() as session, session.begin():
            await move(
                session, call, tenant="acme", expected=S.RESULT_UNKNOWN, target=S.CONFIRMED,
                event_type=EventType.TOOL_CALL_CONFIRMED, producer=Producer.RECONCILER,
            )  # fmt: skip

    await confirm()
    assert moves("result_unknown", "confirmed", "m-send") == before + 1
    with pytest.raises(TransitionConflict):
        await confirm()  # no longer result_unknown: nothing moved
    assert moves("result_unknown", "confirmed", "m-send") == before + 1


async def test_a_move_from_several_statuses_names_them_all(sessions: Sessions) -> None:
    call = await insert_call(sessions, "accepted", cap_id="m-send")
    label = "accepted|result_unknown"
    before = moves(label, "escalated", "m-send")
    async with sessions() as session, session.begin():
        await move(
            session, call, tenant="acme", expected=[S.RESULT_UNKNOWN, S.ACCEPTED],
            target=S.ESCALATED, event_type=EventType.TOOL_CALL_ESCALATED,
            producer=Producer.RECONCILER,
        )  # fmt: skip
    assert moves(label, "escalated", "m-send") == before + 1


async def test_a_batch_move_counts_the_calls_it_moved(sessions: Sessions) -> None:
    waiting = [await insert_call(sessions, "authorized", cap_id="m-bulk") for _ in range(3)]
    gone = await insert_call(sessions, "cancelled", cap_id="m-bulk")
    before = moves("authorized", "dispatching", "m-bulk")
    async with sessions() as session, session.begin():
        moved = await move_many(
            session,
            [BulkMove(call, tenant="acme") for call in [*waiting, gone]],
            expected=S.AUTHORIZED,
            target=S.DISPATCHING,
            event_type=EventType.TOOL_CALL_DISPATCHING,
            producer=Producer.WORKER,
            lease_owner=None,
        )
    assert len(moved) == 3
    assert moves("authorized", "dispatching", "m-bulk") == before + 3  # asked 4, moved 3


async def test_a_routed_batch_counts_each_target_and_capability(sessions: Sessions) -> None:
    ok = await insert_call(sessions, "dispatching", cap_id="m-routed-a")
    bad = await insert_call(sessions, "dispatching", cap_id="m-routed-b")
    late = await insert_call(sessions, "failed", cap_id="m-routed-a")
    before = (
        moves("dispatching", "completed", "m-routed-a"),
        moves("dispatching", "failed", "m-routed-b"),
        moves("dispatching", "failed", "m-routed-a"),
    )

    def routed(call: str, capability: str, target: S) -> RoutedMove:
        context = CallContext(
            tenant="acme", run_id="run-1", tool_call_id=call, capability_id=capability
        )
        return RoutedMove(BulkMove(call, tenant="acme"), target, context)

    async with sessions() as session, session.begin():
        moved = await move_each(
            session,
            [
                routed(ok, "m-routed-a", S.COMPLETED),
                routed(bad, "m-routed-b", S.FAILED),
                routed(late, "m-routed-a", S.FAILED),  # no longer dispatching: skipped
            ],
            expected=S.DISPATCHING,
            routes={
                S.COMPLETED: Route(EventType.TOOL_CALL_COMPLETED),
                S.FAILED: Route(EventType.TOOL_CALL_FAILED),
            },
            producer=Producer.WORKER,
            lease_owner=None,
        )
    assert len(moved) == 2
    assert (
        moves("dispatching", "completed", "m-routed-a"),
        moves("dispatching", "failed", "m-routed-b"),
        moves("dispatching", "failed", "m-routed-a"),
    ) == (before[0] + 1, before[1] + 1, before[2])
