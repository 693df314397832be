"""What a batch move reads back of each moved call: its identity and its events'
context, and its input only when the mover sends the call (a claim). A settlement or
a cancellation has no use for an input, which can be large and is parsed from JSON
for every row (real PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import BulkMove, move_many
from dispatcher.states import ExecutionStatus as S
from tests.fixtures.calls import insert_call

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
INPUT = {"to": "ana@example.com", "body": "x" * 2_000}


@pytest.mark.parametrize("with_input", [False, True])
async def test_a_moved_row_holds_the_input_only_when_asked(
    sessions: Sessions, with_input: bool
) -> None:
    call = await insert_call(sessions, S.RESULT_UNKNOWN.value, input=INPUT)
    async with sessions() as session, session.begin():
        [moved] = await move_many(
            session,
            [BulkMove(call, tenant="acme")],
            expected=S.RESULT_UNKNOWN,
            target=S.CONFIRMED,
            event_type=EventType.TOOL_CALL_CONFIRMED,
            producer=Producer.RECONCILER,
            lease_owner=None,
            with_input=with_input,
        )
    row = moved.row._mapping
    assert (row["tool_call_id"], row["tenant"], row["status"]) == (call, "acme", "confirmed")
    if with_input:
        assert row["input"] == INPUT
    else:
        assert "input" not in row
