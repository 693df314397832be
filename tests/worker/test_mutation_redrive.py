"""Which authorized calls one redrive takes, and where it writes: mutants of
``dispatcher/worker/redrive.py`` that the redrive tests let live
(``python -m bench.mutation --module dispatcher/worker/redrive.py``)."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.ledger.messages import Producer, ce_source, enqueue, outbox_row
from dispatcher.settings import Topics
from dispatcher.tenancy import ordering_key
from dispatcher.worker.redrive import redrive_stale
from tests.fixtures.calls import insert_call
from tests.fixtures.rows import event_types, outbox_rows

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
# Topics of this deployment's own: redrive must read and write where it is told to.
TOPICS = Topics(dispatch="site.commands", events="site.events", escalations="site.escalations")


async def authorized(sessions: Sessions, seconds_ago: int) -> str:
    """An authorized call with no dispatch command at all, authorized ``seconds_ago``."""
    return await insert_call(
        sessions,
        "authorized",
        cap_id="refund",
        updated_at=text(f"now() - interval '{seconds_ago} seconds'"),
    )


async def redrive(sessions: Sessions, **kw: int) -> list[str]:
    return await redrive_stale(sessions, topics=TOPICS, older_than_seconds=60, **kw)


async def test_a_stale_call_gets_a_command_from_the_redriver_on_its_topics(
    sessions: Sessions,
) -> None:
    call = await authorized(sessions, 120)
    young = await authorized(sessions, 5)

    assert await redrive(sessions) == [call]

    [command] = await outbox_rows(sessions, TOPICS.dispatch)
    assert command["key"] == ordering_key("acme", call)
    assert command["headers"]["ce_source"] == ce_source(Producer.REDRIVE)
    assert [r["key"] for r in await outbox_rows(sessions, TOPICS.events)] == [
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

    assert await redrive(sessions) == [call]


async def test_one_redrive_takes_at_most_its_limit(sessions: Sessions) -> None:
    calls = {await authorized(sessions, 120), await authorized(sessions, 90)}
    first = await redrive(sessions, limit=1)
    assert len(first) == 1
    assert set(first + await redrive(sessions)) == calls
