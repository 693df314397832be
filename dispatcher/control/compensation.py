"""Asking for a call's effect to be undone if it happened.

The reconciler reads ``tool_calls.compensation_requested_at``: a call it settles with
that mark set is compensated through the capability's compensation endpoint instead
of confirmed. Stopping a run (issue 6) marks each of its calls here; nothing else
about a call changes, so the mark can be set at any point of its life.
"""

from __future__ import annotations

from sqlalchemy import func, update
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import tool_calls
from dispatcher.errors import ToolCallNotFound
from dispatcher.ledger.events import CallContext, EventType, event_row, record_events
from dispatcher.ledger.messages import Producer
from dispatcher.settings import DEFAULT_TOPICS, Topics


async def request_compensation(
    session: AsyncSession,
    tool_call_id: str,
    *,
    tenant: str,
    reason: str,
    producer: Producer,
    topics: Topics = DEFAULT_TOPICS,
) -> bool:
    """Mark the call, in the caller's transaction; False if it was already marked.

    Raises :class:`ToolCallNotFound` for an unknown call."""
    row = (
        await session.execute(
            update(tool_calls)
            .where(
                tool_calls.c.tenant == tenant,
                tool_calls.c.tool_call_id == tool_call_id,
                tool_calls.c.compensation_requested_at.is_(None),
            )
            .values(compensation_requested_at=func.now(), updated_at=func.now())
            .returning(*tool_calls.c)
        )
    ).first()
    if row is None:
        exists = (
            await session.execute(
                tool_calls.select().where(
                    tool_calls.c.tenant == tenant, tool_calls.c.tool_call_id == tool_call_id
                )
            )
        ).first()
        if exists is None:
            raise ToolCallNotFound(tool_call_id)
        return False
    await record_events(
        session,
        [
            event_row(
                EventType.TOOL_CALL_COMPENSATION_REQUESTED,
                CallContext.of(row._mapping),
                producer=producer,
                payload={"reason": reason},
            )
        ],
        topics=topics,
    )
    return True
