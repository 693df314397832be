"""Asking for a call's effect to be undone if it happened.

The reconciler reads ``tool_calls.compensation_requested_at``: a call it settles with
that mark set is compensated through the capability's compensation endpoint instead
of confirmed. Stopping a run marks each of its calls in flight here; nothing else
about a call changes, so the mark can be set at any point of its life.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import tool_calls
from dispatcher.errors import ToolCallNotFound
from dispatcher.ledger.marks import mark_for_compensation
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
    if await mark_for_compensation(
        session, tool_call_id, tenant=tenant, reason=reason, producer=producer, topics=topics
    ):
        return True
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
