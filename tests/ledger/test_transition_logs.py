"""The single-call mover logs its move as the batch movers do (tests/worker has the
dispatch path): one INFO line when the row moved, none when the move was refused, and
``from`` names every status the move expected. Real PostgreSQL."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.errors import TransitionConflict
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import move
from dispatcher.logs import TRANSITIONS_LOGGER
from dispatcher.states import ExecutionStatus as S
from tests.fixtures.calls import insert_call

pytestmark = pytest.mark.postgres


async def test_a_move_logs_one_line_and_a_refused_one_none(
    sessions: async_sessionmaker[AsyncSession], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=TRANSITIONS_LOGGER)
    call = await insert_call(sessions, "accepted", cap_id="l-send")

    async def escalate() -> None:
        async with sessions() as session, session.begin():
            await move(
                session, call, tenant="acme", expected=[S.RESULT_UNKNOWN, S.ACCEPTED],
                target=S.ESCALATED, event_type=EventType.TOOL_CALL_ESCALATED,
                producer=Producer.RECONCILER,
            )  # fmt: skip

    await escalate()
    with pytest.raises(TransitionConflict):
        await escalate()  # no longer accepted: nothing moved, nothing logged

    [line] = [r for r in caplog.records if r.name == TRANSITIONS_LOGGER]
    assert line.levelno == logging.INFO
    fields = {k: line.__dict__[k] for k in ("from", "to", "tool_call_id", "capability_id")}
    assert fields == {
        "from": "accepted|result_unknown",
        "to": "escalated",
        "tool_call_id": call,
        "capability_id": "l-send",
    }
    assert line.__dict__["run_id"]
