"""The outbox as one tenant sees it: its dead letters, a page at a time, each with the
rows of its key that wait behind it (the relay holds a key's later rows until an
operator retries or discards the dead one).

Pages are keyset pages: a page starts after the last id of the one before, so a row
retried or discarded meanwhile shifts no other row onto the wrong page, and a page
costs the same however many dead letters precede it (no OFFSET to skip through)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import outbox
from dispatcher.ledger.messages import tenant_rows
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
    after: int = 0,
) -> list[DeadLetter]:
    """``tenant``'s dead letters with ids above ``after`` (:func:`dead_letters_query`)."""
    rows = await session.execute(dead_letters_query(tenant, where=where, limit=limit, after=after))
    return [DeadLetter(**row) for row in rows.mappings()]


def dead_letters_query(
    tenant: str, *, where: DeadLetterFilter | None = None, limit: int = 50, after: int = 0
) -> Select[Any]:
    """``tenant``'s dead letters with ids above ``after``, oldest first (by id, as the
    relay's own listing): the next page is the one ``after`` the last id of this one.

    The blocked count is of ``tenant``'s own rows (keys name their tenant, and the
    payload says so again). It is one pass over the unpublished rows for the whole
    page, grouped by key: a count per dead letter read the backlog once per row
    (576 ms for a page of 51 behind 40,000 unpublished rows, 15 ms grouped). The page
    comes from
    ``ix_outbox_dead_letters_tenant``: the tenant's dead letters in id order, whatever
    the published history and whatever other tenants' dead letters.
    """
    page = (
        select(
            outbox.c.id,
            outbox.c.topic,
            outbox.c.key,
            outbox.c.headers["ce_id"].astext.label("message_id"),
            outbox.c.attempts,
            outbox.c.last_error,
            outbox.c.dead_lettered_at,
            outbox.c.created_at,
        )
        .where(
            outbox.c.dead_lettered_at.is_not(None),
            outbox.c.id > after,
            tenant_rows(tenant),
            *(where or DeadLetterFilter()).conditions(),
        )
        .order_by(outbox.c.id)
        .limit(limit)
        .cte("page")
    )
    o = outbox.alias("o")
    waiting = (
        select(o.c.key, func.count().label("n"))
        .where(
            o.c.key.in_(select(page.c.key)),
            o.c.published_at.is_(None),
            o.c.dead_lettered_at.is_(None),
            o.c.payload["tenant"].astext == tenant,
        )
        .group_by(o.c.key)
        .subquery("waiting")
    )
    return (
        select(*page.c, func.coalesce(waiting.c.n, 0).label("blocked_rows"))
        .select_from(page.outerjoin(waiting, waiting.c.key == page.c.key))
        .order_by(page.c.id)
    )
