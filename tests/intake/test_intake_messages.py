"""What intake puts in the outbox: the intake statement builds each event's message
from the row it inserts (in SQL), and it must be exactly what
``dispatcher.ledger.events.event_message`` makes of that event, with the submission's
trace context as headers, in the order of the events per run."""

from __future__ import annotations

from datetime import UTC
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import execution_events, outbox
from dispatcher.intake.service import submit_many
from dispatcher.ledger.events import event_message
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.tracing import Trace

pytestmark = pytest.mark.postgres

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TOPICS = Topics(events="custom.events", dispatch=DEFAULT_TOPICS.dispatch)


async def _table(engine: AsyncEngine, table: Any) -> list[dict[str, Any]]:
    order = table.c.seq if "seq" in table.c else table.c.id
    async with engine.connect() as conn:
        return [dict(r._mapping) for r in await conn.execute(select(table).order_by(order))]


def _published(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("topic", "key", "payload", "headers")}


async def test_each_events_message_is_event_message_of_its_row_with_its_trace(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession], registry: CapabilityRegistry
) -> None:
    requests = [
        SubmitRequest(
            tool_call_id="tc-1", run_id="run-1", capability_id="send-email", input={"to": "a@x.io"}
        ),
        SubmitRequest(
            tool_call_id="tc-2",
            run_id="run-1",
            capability_id="refund-order-approved",
            input={"orderId": "o-9", "amountCents": 900_000},
        ),
        SubmitRequest(
            tool_call_id="tc-3", run_id="run-2", capability_id="send-email", input={"to": "b@x.io"}
        ),
    ]
    traces: list[Trace] = [(PARENT, "vendor=1"), (PARENT, None), None]
    async with sessions() as session, session.begin():
        await submit_many(
            session,
            [(r, "acme") for r in requests],
            registry=registry,
            topics=TOPICS,
            traces=traces,
        )

    events = await _table(engine, execution_events)
    messages = [m for m in await _table(engine, outbox) if m["topic"] == TOPICS.events]
    by_call = dict(zip(["tc-1", "tc-2", "tc-3"], traces, strict=True))
    expected = []
    for event in events:
        # As the row was planned: its time in UTC, as intake's clock gave it.
        planned = {**event, "occurred_at": event["occurred_at"].astimezone(UTC)}
        message = event_message(planned, TOPICS)
        trace = by_call[event["tool_call_id"]]
        if trace is not None:
            message["headers"]["traceparent"] = trace[0]
            if trace[1]:
                message["headers"]["tracestate"] = trace[1]
        expected.append(_published(message))
    assert len(events) == 6
    # In the events' own order: each run's facts reach its consumers in order.
    assert [_published(m) for m in messages] == expected
