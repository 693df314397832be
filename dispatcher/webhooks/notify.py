"""Writing a notification: in the caller's transaction, so it exists iff the fact does.

One row per notification, whoever subscribes: subscriptions are settings, loaded once
by each process that needs them and not known to the code writing facts, so the sender
fans each row out to the subscriptions configured when it reads it (one delivery per
subscription of the tenant, or of every tenant when ``tenant`` is None). A notification
nobody subscribes to is dropped at fan-out; a subscription added later is not sent
what was fanned out before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import webhook_notifications
from dispatcher.errors import InternalError
from dispatcher.ids import random_hex
from dispatcher.webhooks.events import EVENT_TYPES


async def notify(
    session: AsyncSession,
    *,
    event_type: str,
    tenant: str | None,
    data: Mapping[str, Any],
) -> None:
    """Record that subscribers of ``event_type`` must be told ``data``, in ``session``'s
    transaction (never committed here: the caller's commit writes it with its fact).

    ``tenant`` is the tenant the fact belongs to; None (or ``""``, the every-tenant scope
    of pauses and breakers) sends it to that event type's subscribers of every tenant.
    ``data`` must be JSON (datetimes allowed) and hold no secret: it is sent as it is.
    """
    await session.execute(
        insert(webhook_notifications).values(notification_rows(event_type, [(tenant, data)]))
    )


NOTIFY_MANY = (
    "INSERT INTO webhook_notifications (notification_id, event_type, tenant, data)"
    " SELECT n.notification_id, n.event_type, n.tenant, n.data"
    " FROM jsonb_to_recordset(%(notifications)s)"
    " AS n(notification_id text, event_type text, tenant text, data jsonb)"
    " RETURNING notification_id"
)
""":func:`notify` for many facts in one statement, on a psycopg connection (intake's
path, which bypasses SQLAlchemy): ``%(notifications)s`` is the jsonb array of
:func:`notification_rows`."""


def notification_rows(
    event_type: str, facts: Iterable[tuple[str | None, Mapping[str, Any]]]
) -> list[dict[str, Any]]:
    """The rows recording that ``event_type`` happened for each ``(tenant, data)``."""
    if event_type not in EVENT_TYPES:
        # A typo in a caller would otherwise be dropped silently at fan-out.
        raise InternalError(f"unknown webhook event type {event_type!r}")
    return [
        {
            "notification_id": f"ntf_{random_hex()}",
            "event_type": event_type,
            "tenant": tenant or None,
            "data": dict(data),
        }
        for tenant, data in facts
    ]
