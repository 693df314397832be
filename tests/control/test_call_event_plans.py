"""A call's events are read from the days it can have events in. The log is
partitioned by day (a month of retention keeps about 40 of them), and a lookup by call
alone probes the index of every day; the call's creation bounds the days from below, so
a recent call's events are read from its own few days, however many the log keeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import PARTITIONS, execution_events
from dispatcher.ledger import retention
from dispatcher.views.queries import call_events, events_of_call
from tests.fixtures.calls import submit_call
from tests.fixtures.plans import explain

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
KEPT_DAYS = 40


async def test_a_recent_calls_events_are_read_from_its_own_days(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    today = datetime.now(UTC).date()
    async with sessions() as session, session.begin():
        await retention.ensure_partitions(
            session, [today - timedelta(days=n) for n in range(KEPT_DAYS)]
        )
    call = await submit_call(sessions, registry, "send-email", {"to": "a@example.com"})

    async with sessions() as session:
        events = await call_events(session, "acme", call)
        plan = await explain(
            session,
            select(execution_events)
            .where(events_of_call("acme", call))
            .order_by(execution_events.c.seq),
        )
    assert [e.event_type for e in events] == ["tool.call.requested", "tool.call.authorized"]
    days = [n for n in plan.nodes() if PARTITIONS.fullmatch(n.get("Relation Name", "")) is not None]
    probed = [n["Relation Name"] for n in days if n.get("Actual Loops", 0) > 0]
    assert len(days) > KEPT_DAYS  # every day is in the plan...
    # ...but only yesterday's, today's and the days made ahead of it are probed.
    assert 0 < len(probed) <= 10, probed
