"""The redrive sweep asks, for the calls it found waiting in ``authorized``, whether a
dispatch command of theirs is waiting or recent. It asks during incidents, so it must
read those calls' commands and nothing else: on an outbox of 350,000 rows (seven a call,
50,000 calls), in the plan PostgreSQL runs. Asked by key and topic alone, it read all
of them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.tenancy import ordering_key
from dispatcher.worker.redrive import commands_in_flight_query
from tests.fixtures.plans import explain

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]


async def test_the_outbox_check_reads_the_waiting_calls_commands_only(history: Sessions) -> None:
    async with history() as session:
        waiting = (
            await session.execute(
                text("SELECT tenant, tool_call_id FROM tool_calls WHERE status = 'authorized'")
            )
        ).all()
        keys = [ordering_key(tenant, call) for tenant, call in waiting]
        # And as many of acme's calls long finished (tc-9, tc-12, ...: none in flight),
        # whose one command was published long ago.
        keys += [ordering_key("acme", f"tc-{n}") for n in range(9, 3 * len(waiting) + 9, 3)]
        query = commands_in_flight_query(keys, func.now() - timedelta(minutes=5), DEFAULT_TOPICS)
        plan = await explain(session, query)
        covered = set((await session.execute(query)).scalars())
    assert len(waiting) == 50
    # The waiting calls' commands are unpublished: each is covered, no finished one is.
    assert covered == {ordering_key(tenant, call) for tenant, call in waiting}
    # One command a call: the rows of the keys asked about, not the outbox.
    assert plan.rows_examined <= len(keys), (plan.rows_examined, len(keys))
    assert (plan.seq_scans, plan.indexes) == (set(), {"ix_outbox_dispatch_commands"})
