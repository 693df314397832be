"""An operator's answer to a dead letter, for one tenant: retry it (after fixing the
cause) or discard it; either releases the rows of its key that wait behind it.

Each is one statement that also checks the row is a dead letter of the caller's
tenant, so the check and the act cannot drift apart (a row retried by someone else a
moment earlier is simply not found). They do what :mod:`outbox_relay.dead_letters`
does for the CLI, with the tenant added: the CLI acts for the whole installation, an
API key only for its tenant. ``tests/console/test_console_ops.py`` holds the two to
the same effect on the row.
"""

from __future__ import annotations

import logging

from sqlalchemy import ColumnElement, delete, update
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.control.actor import Actor
from dispatcher.db.tables import outbox
from dispatcher.errors import DeadLetterNotFound
from dispatcher.views.overview import tenant_rows

log = logging.getLogger(__name__)


def _dead_letter_of(tenant: str, row_id: int) -> ColumnElement[bool]:
    mine: ColumnElement[bool] = (
        (outbox.c.id == row_id) & outbox.c.dead_lettered_at.is_not(None) & tenant_rows(tenant)
    )
    return mine


async def retry_dead_letter(
    session: AsyncSession, row_id: int, *, tenant: str, actor: Actor
) -> None:
    """Put ``tenant``'s dead letter ``row_id`` back in line: the relay sends it
    again (from a fresh attempt count), then its key's waiting rows.
    :class:`DeadLetterNotFound` when it is not one (also another tenant's)."""
    found = await session.scalar(
        update(outbox)
        .where(_dead_letter_of(tenant, row_id))
        .values(dead_lettered_at=None, attempts=0)
        .returning(outbox.c.id)
    )
    _done(found, row_id, "retried", actor)


async def discard_dead_letter(
    session: AsyncSession, row_id: int, *, tenant: str, actor: Actor
) -> None:
    """Delete ``tenant``'s dead letter ``row_id`` for good, releasing its key.
    :class:`DeadLetterNotFound` when it is not one (also another tenant's)."""
    found = await session.scalar(
        delete(outbox).where(_dead_letter_of(tenant, row_id)).returning(outbox.c.id)
    )
    _done(found, row_id, "discarded", actor)


def _done(found: int | None, row_id: int, what: str, actor: Actor) -> None:
    if found is None:
        raise DeadLetterNotFound(row_id)
    # The outbox keeps no history of its own: the log line is the record of who did it.
    log.info("dead letter %d %s by %s", row_id, what, actor.label)
