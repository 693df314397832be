"""An operator's answer to a dead letter of one tenant: put it back in line, or delete
it; either releases the rows of its key that wait behind it.

Each is one statement that also checks the row is a dead letter of the tenant, so the
check and the act cannot drift apart (a row retried by someone else a moment earlier
is simply not found). They do what :mod:`outbox_relay.dead_letters` does for the CLI,
with the tenant added: the CLI acts for the whole installation, an API key only for
its tenant.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, delete, update
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import outbox
from dispatcher.ledger.messages import tenant_rows


def _dead_letter_of(tenant: str, row_id: int) -> ColumnElement[bool]:
    mine: ColumnElement[bool] = (
        (outbox.c.id == row_id) & outbox.c.dead_lettered_at.is_not(None) & tenant_rows(tenant)
    )
    return mine


async def requeue_dead_letter(session: AsyncSession, row_id: int, *, tenant: str) -> bool:
    """Put ``tenant``'s dead letter ``row_id`` back in line, from a fresh attempt count,
    in the caller's transaction; False when it is not one (also another tenant's)."""
    found = await session.scalar(
        update(outbox)
        .where(_dead_letter_of(tenant, row_id))
        .values(dead_lettered_at=None, attempts=0)
        .returning(outbox.c.id)
    )
    return found is not None


async def drop_dead_letter(session: AsyncSession, row_id: int, *, tenant: str) -> bool:
    """Delete ``tenant``'s dead letter ``row_id`` for good, in the caller's transaction;
    False when it is not one (also another tenant's)."""
    found = await session.scalar(
        delete(outbox).where(_dead_letter_of(tenant, row_id)).returning(outbox.c.id)
    )
    return found is not None
