"""The only writer of webhook deliveries: fan-out, claim, and each attempt's result.

Every status change is a conditional UPDATE whose WHERE names the statuses the
transition table (:data:`dispatcher.states.WEBHOOK_DELIVERY_TRANSITIONS`) allows, and
every result of an attempt is fenced by the claim that made it (``leased_by`` and
``attempts``): a sender that outlived its lease cannot overwrite the next one's result.

Claims read the live set only (``ix_webhook_deliveries_due``: pending rows) and lock
what they take with ``FOR UPDATE SKIP LOCKED``, so several senders take different
deliveries. A claim moves ``next_attempt_at`` to the lease's end: a sender that dies
mid-POST leaves its deliveries due again when the lease lapses (at least once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, delete, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import ReturningDelete

from dispatcher.db.tables import (
    webhook_deliveries,
    webhook_notifications,
    webhook_subscription_states,
)
from dispatcher.db.webhooks import DEAD_DELIVERIES
from dispatcher.ids import random_hex
from dispatcher.states import WebhookDeliveryStatus, webhook_delivery_sources
from dispatcher.webhook_settings import WebhookSubscription
from dispatcher.webhooks.events import body

PENDING = WebhookDeliveryStatus.PENDING
DEAD = WebhookDeliveryStatus.DEAD


@dataclass(frozen=True, slots=True)
class Claimed:
    """One delivery a sender holds for one attempt."""

    delivery_id: str
    subscription_id: str
    tenant: str
    event_type: str
    body: str
    attempts: int
    """This attempt's number (1 for the first)."""


def subscribers(
    subscriptions: Sequence[WebhookSubscription], *, event_type: str, tenant: str | None
) -> list[WebhookSubscription]:
    """Who is told of an ``event_type`` fact of ``tenant``: that tenant's subscriptions
    to it, or every tenant's when the fact is every tenant's (``tenant`` None)."""
    return [
        s
        for s in subscriptions
        if event_type in s.events and (tenant is None or s.tenant == tenant)
    ]


async def fan_out(
    session: AsyncSession, subscriptions: Sequence[WebhookSubscription], *, limit: int
) -> list[str]:
    """Turn up to ``limit`` notifications into one pending delivery per subscriber and
    delete them, in the caller's transaction; returns the event type of each one read.

    Claimed, not read past a watermark: a notification whose transaction commits late
    (ids are taken at insert, visible at commit) is simply found by a later pass.
    """
    rows = (
        await session.execute(
            select(webhook_notifications)
            .order_by(webhook_notifications.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    ).all()
    if not rows:
        return []
    values = [
        {
            "delivery_id": f"msg_{random_hex()}",
            "notification_id": row.notification_id,
            "subscription_id": sub.id,
            "tenant": sub.tenant,
            "event_type": row.event_type,
            "body": body(
                notification_id=row.notification_id,
                event_type=row.event_type,
                tenant=row.tenant,
                occurred_at=row.occurred_at,
                data=row.data,
            ),
            "status": PENDING.value,
            "next_attempt_at": func.now(),
        }
        for row in rows
        for sub in subscribers(subscriptions, event_type=row.event_type, tenant=row.tenant)
    ]
    if values:
        await session.execute(insert(webhook_deliveries).values(values))
    await session.execute(
        delete(webhook_notifications).where(
            webhook_notifications.c.id.in_([row.id for row in rows])
        )
    )
    return [row.event_type for row in rows]


# Per subscription, its oldest due rows up to its room (``ix_webhook_deliveries_due``
# is per subscription): however long one subscription's backlog, the others' due rows
# are candidates in the same claim, so a slow receiver cannot starve them. A subscription
# backing off is skipped whole. The lock is taken per subscription (SKIP LOCKED: another
# sender's rows are passed over); of the candidates, the oldest ``limit`` are claimed.
_CLAIM = text(
    """
WITH due AS (
    SELECT c.delivery_id
    FROM unnest(CAST(:ids AS text[]), CAST(:rooms AS int[])) AS s(subscription_id, room)
    CROSS JOIN LATERAL (
        SELECT d.delivery_id, d.next_attempt_at FROM webhook_deliveries d
        WHERE d.status = 'pending' AND d.subscription_id = s.subscription_id
          AND d.next_attempt_at <= now()
        ORDER BY d.next_attempt_at
        LIMIT s.room
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE s.room > 0 AND NOT EXISTS (
        SELECT 1 FROM webhook_subscription_states st
        WHERE st.subscription_id = s.subscription_id AND st.retry_at > now())
    ORDER BY c.next_attempt_at
    LIMIT :limit
)
UPDATE webhook_deliveries w
SET next_attempt_at = now() + make_interval(secs => :lease),
    leased_by = :owner, attempts = w.attempts + 1, updated_at = now()
FROM due WHERE w.delivery_id = due.delivery_id
RETURNING w.delivery_id, w.subscription_id, w.tenant, w.event_type, w.body, w.attempts
"""
)


async def claim_due(
    session: AsyncSession,
    *,
    owner: str,
    limit: int,
    lease_seconds: float,
    room: Mapping[str, int],
) -> list[Claimed]:
    """Give ``owner`` up to ``limit`` due deliveries for ``lease_seconds``: at most
    ``room[s]`` of subscription ``s``, and none of a subscription not in ``room``."""
    if limit < 1 or not room:
        return []
    rows = await session.execute(
        _CLAIM,
        {
            "limit": limit,
            "lease": lease_seconds,
            "owner": owner,
            "ids": list(room),
            "rooms": list(room.values()),
        },
    )
    return [Claimed(*row) for row in rows.all()]


async def kill_unconfigured(session: AsyncSession, configured: Sequence[str]) -> int:
    """Pending deliveries of subscriptions no longer configured become dead (no sender
    would claim them): listed in the console, sent again if the subscription comes back."""
    moved = await session.execute(
        update(webhook_deliveries)
        .where(
            webhook_deliveries.c.status.in_(webhook_delivery_sources(DEAD)),
            webhook_deliveries.c.status == PENDING.value,
            webhook_deliveries.c.subscription_id.not_in(configured),
        )
        .values(
            status=DEAD.value,
            leased_by=None,
            last_error="subscription no longer configured",
            updated_at=func.now(),
        )
        .returning(webhook_deliveries.c.delivery_id)
    )
    return len(moved.all())


def _fenced(claim: Claimed, owner: str) -> list[ColumnElement[bool]]:
    return [
        webhook_deliveries.c.delivery_id == claim.delivery_id,
        webhook_deliveries.c.status == PENDING.value,
        webhook_deliveries.c.leased_by == owner,
        webhook_deliveries.c.attempts == claim.attempts,
    ]


async def record_delivered(session: AsyncSession, claim: Claimed, *, owner: str) -> bool:
    """The receiver took it: the delivery is removed (the table keeps the live set and
    the dead), and its subscription's backoff ends. False if the claim was lost."""
    gone = await session.execute(
        delete(webhook_deliveries)
        .where(*_fenced(claim, owner))
        .returning(webhook_deliveries.c.delivery_id)
    )
    await session.execute(
        update(webhook_subscription_states)
        .where(webhook_subscription_states.c.subscription_id == claim.subscription_id)
        .values(failures=0, retry_at=None)
    )
    return gone.first() is not None


async def record_failed(
    session: AsyncSession,
    claim: Claimed,
    *,
    owner: str,
    error: str,
    retry_in: float,
    dead: bool,
) -> bool:
    """An attempt failed: due again in ``retry_in`` seconds, or dead when ``dead``.
    False if the claim was lost (another sender holds the delivery now)."""
    target = DEAD if dead else PENDING
    moved = await session.execute(
        update(webhook_deliveries)
        .where(
            *_fenced(claim, owner),
            webhook_deliveries.c.status.in_(webhook_delivery_sources(target)),
        )
        .values(
            status=target.value,
            leased_by=None,
            last_error=error[:500],
            next_attempt_at=func.now() + timedelta(seconds=retry_in),
            updated_at=func.now(),
        )
        .returning(webhook_deliveries.c.delivery_id)
    )
    return moved.first() is not None


async def back_off_subscription(
    session: AsyncSession, subscription_id: str, *, delay_for: Callable[[int], float]
) -> None:
    """Hold every delivery of ``subscription_id`` back after a failure: a receiver that
    is down is probed by one delivery per backoff, not hit by all of them.

    ``delay_for`` maps the subscription's failures in a row to seconds. Failures that
    land while it is already backing off (the other POSTs in flight) do not count again.
    """
    states = webhook_subscription_states
    counted = await session.execute(
        pg_insert(states)
        .values(subscription_id=subscription_id, failures=1)
        .on_conflict_do_update(
            index_elements=[states.c.subscription_id],
            set_={
                "failures": text(
                    "CASE WHEN webhook_subscription_states.retry_at > now()"
                    " THEN webhook_subscription_states.failures"
                    " ELSE webhook_subscription_states.failures + 1 END"
                )
            },
        )
        .returning(states.c.failures)
    )
    failures = int(counted.scalar_one())
    await session.execute(
        update(states)
        .where(states.c.subscription_id == subscription_id)
        .values(retry_at=func.now() + timedelta(seconds=delay_for(failures)))
    )


async def redeliver(session: AsyncSession, *, tenant: str, delivery_id: str, by: str) -> bool:
    """Operator ``by`` sends a dead delivery again (``dead -> pending``, its attempts
    from zero, due now; who and when kept on it). False when it is not a dead delivery
    of ``tenant``."""
    moved = await session.execute(
        update(webhook_deliveries)
        .where(
            webhook_deliveries.c.delivery_id == delivery_id,
            webhook_deliveries.c.tenant == tenant,
            webhook_deliveries.c.status.in_(webhook_delivery_sources(PENDING)),
            webhook_deliveries.c.status == DEAD.value,
        )
        .values(
            status=PENDING.value,
            attempts=0,
            leased_by=None,
            next_attempt_at=func.now(),
            updated_at=func.now(),
            redelivered_by=by,
            redelivered_at=func.now(),
        )
        .returning(webhook_deliveries.c.delivery_id)
    )
    return moved.first() is not None


async def purge_dead(session: AsyncSession, *, kept_seconds: float, limit: int = 500) -> int:
    """Remove the dead deliveries that died more than ``kept_seconds`` ago and were not
    sent again, the oldest first, at most ``limit``; how many. A delivery another
    sender holds locked is left for its next pass."""
    gone = await session.execute(purge_dead_statement(kept_seconds, limit))
    return len(gone.all())


def purge_dead_statement(kept_seconds: float, limit: int) -> ReturningDelete[Any]:
    """:func:`purge_dead`'s statement: a range of ``ix_webhook_deliveries_dead_since``,
    the expired dead only, whatever else the table holds."""
    died_before = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, kept_seconds)
    # Materialized: as a subquery under IN, a rescan of it skips the rows this DELETE
    # already removed and takes the next ones, past the limit.
    doomed = (
        select(webhook_deliveries.c.delivery_id)
        .where(DEAD_DELIVERIES, webhook_deliveries.c.updated_at < died_before)
        .order_by(webhook_deliveries.c.updated_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("doomed")
        .prefix_with("MATERIALIZED")
    )
    return (
        delete(webhook_deliveries)
        .where(webhook_deliveries.c.delivery_id == doomed.c.delivery_id, DEAD_DELIVERIES)
        .returning(webhook_deliveries.c.delivery_id)
    )
