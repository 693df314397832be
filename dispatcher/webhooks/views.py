"""What the console shows of webhooks: a tenant's dead deliveries, a keyset page at a
time (``ix_webhook_deliveries_dead``: a range of one tenant's dead rows, whatever else
the table holds)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import webhook_deliveries
from dispatcher.db.webhooks import DEAD_DELIVERIES

d = webhook_deliveries.c


@dataclass(frozen=True, slots=True)
class DeadDelivery:
    """One dead delivery as the console lists it (never its body: the page is a list)."""

    seq: int
    delivery_id: str
    subscription_id: str
    event_type: str
    attempts: int
    last_error: str | None
    created_at: datetime
    dead_at: datetime
    redelivered_by: str | None
    """Who last sent it again from the console (None: never), and when."""
    redelivered_at: datetime | None


def dead_deliveries_query(tenant: str, *, after: int, limit: int) -> Select[Any]:
    """The statement of :func:`dead_deliveries` (its plan is a test's to check)."""
    return (
        select(
            d.seq,
            d.delivery_id,
            d.subscription_id,
            d.event_type,
            d.attempts,
            d.last_error,
            d.created_at,
            d.updated_at,
            d.redelivered_by,
            d.redelivered_at,
        )
        .where(DEAD_DELIVERIES, d.tenant == tenant, d.seq > after)
        .order_by(d.seq)
        .limit(limit)
    )


async def dead_deliveries(
    session: AsyncSession, tenant: str, *, after: int, limit: int
) -> list[DeadDelivery]:
    """``tenant``'s dead deliveries after cursor ``after`` (0: from the first), oldest
    first, at most ``limit``."""
    rows = await session.execute(dead_deliveries_query(tenant, after=after, limit=limit))
    return [DeadDelivery(*row) for row in rows.all()]
