"""The outbox as one tenant sees it: its dead letters, a page at a time, each with the
rows of its key that wait behind it (the relay holds a key's later rows until an
operator retries or discards the dead one)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import outbox
from dispatcher.views.overview import tenant_rows
from outbox_relay import DeadLetter


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Narrows the list to one topic and/or one key (exact match; empty: any)."""

    topic: str = ""
    key: str = ""

    def conditions(self) -> list[ColumnElement[bool]]:
        found: list[ColumnElement[bool]] = []
        if self.topic:
            found.append(outbox.c.topic == self.topic)
        if self.key:
            found.append(outbox.c.key == self.key)
        return found


async def dead_letters(
    session: AsyncSession,
    tenant: str,
    *,
    where: DeadLetterFilter | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[DeadLetter]:
    """``tenant``'s dead letters, oldest first (by id, as the relay's own listing).

    The blocked count is of ``tenant``'s own rows: keys are run and call ids, which two
    tenants may share, and another tenant's waiting rows are not this one's to count.
    """
    o = outbox.alias("o")
    blocked = (
        select(func.count())
        .select_from(o)
        .where(
            o.c.key == outbox.c.key,
            o.c.published_at.is_(None),
            o.c.dead_lettered_at.is_(None),
            o.c.payload["tenant"].astext == tenant,
        )
        .scalar_subquery()
    )
    rows = await session.execute(
        select(
            outbox.c.id,
            outbox.c.topic,
            outbox.c.key,
            outbox.c.headers["ce_id"].astext,
            outbox.c.attempts,
            outbox.c.last_error,
            outbox.c.dead_lettered_at,
            outbox.c.created_at,
            blocked,
        )
        .where(
            outbox.c.dead_lettered_at.is_not(None),
            tenant_rows(tenant),
            *(where or DeadLetterFilter()).conditions(),
        )
        .order_by(outbox.c.id)
        .limit(limit)
        .offset(offset)
    )
    return [DeadLetter(*row) for row in rows]
