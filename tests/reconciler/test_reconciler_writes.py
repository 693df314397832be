"""The reconciler's settlement writes against real PostgreSQL: each is fenced by the
claim it was decided under (owner and version), and each writes what it settled, to
the configured topics."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.errors import TransitionConflict
from dispatcher.settings import Topics
from reconciler.due import DueCall, claim_due
from reconciler.record import Writer
from reconciler.rulings import Retry, Settlement
from tests.fixtures.calls import insert_unknown_calls
from tests.fixtures.rows import call_row, events_of, outbox_rows

pytestmark = pytest.mark.postgres
TOPICS = Topics(dispatch="t.commands", events="t.events", escalations="t.escalations")


async def claimed(
    sessions: async_sessionmaker[AsyncSession], owner: str, external_id: str | None = None
) -> DueCall:
    key = f"k-{uuid.uuid4().hex[:8]}"
    await insert_unknown_calls(
        sessions, [key], "refund", external_ids={key: external_id} if external_id else None
    )
    async with sessions() as session, session.begin():
        (call,) = await claim_due(session, owner=owner, limit=1, lease_seconds=60)
    return call


async def writes_change_nothing(
    sessions: async_sessionmaker[AsyncSession], writer: Writer, call: DueCall
) -> None:
    before = await call_row(sessions, call.tool_call_id)
    async with sessions() as session, session.begin():
        assert await writer.confirm(session, [Settlement(call, {})], succeeded=True) == []
        assert await writer.retry(session, [Retry(call, 1.0, {})]) == []
    for write in (
        lambda s: writer.escalate(s, call, reason="r", evidence={}),
        lambda s: writer.compensated(s, Settlement(call, {})),
    ):
        with pytest.raises(TransitionConflict):
            async with sessions() as session, session.begin():
                await write(session)
    assert await call_row(sessions, call.tool_call_id) == before


async def test_no_write_lands_on_a_call_claimed_by_another_reconciler(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    call = await claimed(sessions, "rec-b")
    # Same version as the claim: only the owner tells them apart.
    await writes_change_nothing(sessions, Writer("rec-a", TOPICS), call)


async def test_no_write_lands_on_a_view_older_than_the_claim(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    call = await claimed(sessions, "rec-b")
    stale = dataclasses.replace(call, version=call.version - 1)
    await writes_change_nothing(sessions, Writer("rec-b", TOPICS), stale)


async def test_compensated_records_the_reversal_and_keeps_the_known_request_id(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    call = await claimed(sessions, "rec-b", external_id="req_known")
    evidence = {"decision": "compensate", "attempt": 1}
    async with sessions() as session, session.begin():
        await Writer("rec-b", TOPICS).compensated(
            session, Settlement(call, evidence, {"effect": 1}, None)
        )

    row = await call_row(sessions, call.tool_call_id)
    assert row["status"] == "compensated"
    assert row["external_request_id"] == "req_known"
    assert row["result"] == {"effect": 1}
    assert row["reconcile_attempts"] == call.reconcile_attempts + 1
    assert row["lease_owner"] is None
    (event,) = [e for e in await events_of(sessions, call.tool_call_id)]
    assert event["event_type"] == "tool.call.compensated"
    assert event["payload"].items() >= evidence.items()
    published = [r.payload["eventType"] for r in await outbox_rows(sessions, TOPICS.events)]
    assert published == ["tool.call.compensated"]


async def test_a_settlement_keeps_the_request_id_the_lookup_found(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    call = await claimed(sessions, "rec-b")  # sent, but the provider's id never came back
    async with sessions() as session, session.begin():
        await Writer("rec-b", TOPICS).compensated(
            session, Settlement(call, {}, {"effect": 1}, "req_found")
        )
    assert (await call_row(sessions, call.tool_call_id))["external_request_id"] == "req_found"


async def test_confirm_and_escalate_publish_to_the_configured_topics(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    writer = Writer("rec-b", TOPICS)
    call = await claimed(sessions, "rec-b")
    async with sessions() as session, session.begin():
        assert await writer.confirm(session, [Settlement(call, {"n": 1})], succeeded=True) == [
            call.tool_call_id
        ]
    other = await claimed(sessions, "rec-b")
    async with sessions() as session, session.begin():
        await writer.escalate(session, other, reason="why", evidence={"x": 1})

    events = [r.payload["eventType"] for r in await outbox_rows(sessions, TOPICS.events)]
    assert events == ["tool.call.confirmed", "tool.call.escalated"]
    assert len(await outbox_rows(sessions, TOPICS.escalations)) == 1
    assert (await call_row(sessions, other.tool_call_id))["reconcile_attempts"] == 1
