"""An operator's answer to a dead letter, for one tenant: retry it (after fixing the
cause) or discard it; either releases the rows of its key that wait behind it.

The statements are the ledger's (:mod:`dispatcher.ledger.dead_letters`): each checks
the row is a dead letter of the caller's tenant in the same statement that acts on
it. ``tests/console/test_console_ops.py`` holds them and :mod:`outbox_relay.dead_letters`
(the CLI's, for the whole installation) to the same effect on the row.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.control.actor import Actor
from dispatcher.errors import DeadLetterNotFound
from dispatcher.ledger.dead_letters import drop_dead_letter, requeue_dead_letter

log = logging.getLogger(__name__)


async def retry_dead_letter(
    session: AsyncSession, row_id: int, *, tenant: str, actor: Actor
) -> None:
    """Put ``tenant``'s dead letter ``row_id`` back in line: the relay sends it
    again (from a fresh attempt count), then its key's waiting rows.
    :class:`DeadLetterNotFound` when it is not one (also another tenant's)."""
    _done(await requeue_dead_letter(session, row_id, tenant=tenant), row_id, "retried", actor)


async def discard_dead_letter(
    session: AsyncSession, row_id: int, *, tenant: str, actor: Actor
) -> None:
    """Delete ``tenant``'s dead letter ``row_id`` for good, releasing its key.
    :class:`DeadLetterNotFound` when it is not one (also another tenant's)."""
    _done(await drop_dead_letter(session, row_id, tenant=tenant), row_id, "discarded", actor)


def _done(found: bool, row_id: int, what: str, actor: Actor) -> None:
    if not found:
        raise DeadLetterNotFound(row_id)
    # The outbox keeps no history of its own: the log line is the record of who did it.
    log.info("dead letter %d %s by %s", row_id, what, actor.label)
