"""The webhook tables (migration 0022).

``webhook_notifications`` is the outbox of webhooks: :func:`dispatcher.webhooks.notify`
writes one row in the transaction of the fact it reports, and the sender fans each row
out to the subscriptions configured at that moment, one ``webhook_deliveries`` row per
subscription, deleting the notification in the same transaction. So the notifications
table holds only what is not fanned out yet, and the deliveries table is the record of
what was sent to whom. ``webhook_subscription_states`` holds each subscription's
backoff, shared by every sender process: a receiver that is down is probed, not
flooded, and never holds up another subscription. ``webhook_reported`` marks what a
sweep already reported (an outbox dead letter, an approval about to expire).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from dispatcher.states import WebhookDeliveryStatus

_STATUSES = ", ".join(f"'{s.value}'" for s in WebhookDeliveryStatus)
DEAD_DELIVERIES = text(f"webhook_deliveries.status = '{WebhookDeliveryStatus.DEAD.value}'")
"""The predicate of ``ix_webhook_deliveries_dead``, written into the statement (not
bound) so the planner can prove the partial index serves it."""


def webhook_notifications_table(metadata: MetaData) -> Table:
    return Table(
        "webhook_notifications",
        metadata,
        # Fan-out order; never a watermark (rows are claimed, then deleted).
        Column("id", BigInteger, Identity(always=True), primary_key=True),
        Column("notification_id", Text, nullable=False),
        Column("event_type", Text, nullable=False),
        # NULL: the fact concerns every tenant (a capability-wide breaker).
        Column("tenant", Text),
        Column("data", JSONB, nullable=False),
        Column("occurred_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        UniqueConstraint("notification_id", name="uq_webhook_notifications_notification_id"),
    )


def webhook_deliveries_table(metadata: MetaData) -> Table:
    return Table(
        "webhook_deliveries",
        metadata,
        # The console's cursor (newest first), so paging never reads what it skips.
        Column("seq", BigInteger, Identity(always=True), nullable=False),
        # The ``webhook-id`` header: the same on every attempt of this delivery.
        Column("delivery_id", Text, primary_key=True),
        Column("notification_id", Text, nullable=False),
        Column("subscription_id", Text, nullable=False),
        # The subscription's tenant: the console shows a tenant its own deliveries only.
        Column("tenant", Text, nullable=False),
        Column("event_type", Text, nullable=False),
        # The exact bytes signed and sent, fixed at fan-out so retries send the same.
        Column("body", Text, nullable=False),
        Column("status", Text, nullable=False),
        Column("attempts", Integer, nullable=False, server_default="0"),
        Column("next_attempt_at", DateTime(timezone=True), nullable=False),
        # Who holds the current attempt (a sender process), until next_attempt_at.
        Column("leased_by", Text),
        Column("last_error", Text),
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        # Who last sent it again from the console, and when: a delivery that dies again
        # tells the next operator that someone already tried.
        Column("redelivered_by", Text),
        Column("redelivered_at", DateTime(timezone=True)),
        CheckConstraint(f"status IN ({_STATUSES})", name="ck_webhook_deliveries_status"),
        UniqueConstraint("seq", name="uq_webhook_deliveries_seq"),
        Index(
            "ix_webhook_deliveries_due",
            "subscription_id",
            "next_attempt_at",
            postgresql_where=text(f"status = '{WebhookDeliveryStatus.PENDING.value}'"),
        ),
        Index(
            "ix_webhook_deliveries_dead",
            "tenant",
            "seq",
            postgresql_where=text(f"status = '{WebhookDeliveryStatus.DEAD.value}'"),
        ),
        # The dead by the time they died (updated_at): the oldest leave first.
        Index(
            "ix_webhook_deliveries_dead_since",
            "updated_at",
            postgresql_where=text(f"status = '{WebhookDeliveryStatus.DEAD.value}'"),
        ),
    )


def webhook_subscription_states_table(metadata: MetaData) -> Table:
    return Table(
        "webhook_subscription_states",
        metadata,
        Column("subscription_id", Text, primary_key=True),
        # Failures in a row; a 2xx resets it.
        Column("failures", Integer, nullable=False, server_default="0"),
        # No delivery of the subscription is claimed before this.
        Column("retry_at", DateTime(timezone=True)),
    )


def webhook_reported_table(metadata: MetaData) -> Table:
    return Table(
        "webhook_reported",
        metadata,
        # What a sweep found and reported once: "dead_letter" (ref: the outbox row's id
        # and dead-letter time, so a retried row dead-lettered again is reported again),
        # "approval_expiring" (ref: the approval id).
        Column("kind", Text, nullable=False),
        Column("ref", Text, nullable=False),
        PrimaryKeyConstraint("kind", "ref", name="webhook_reported_pkey"),
    )


def webhook_tables(metadata: MetaData) -> tuple[Table, Table, Table, Table]:
    """The four tables, in :mod:`dispatcher.db.tables`' metadata: notifications,
    deliveries, subscription states, reported."""
    return (
        webhook_notifications_table(metadata),
        webhook_deliveries_table(metadata),
        webhook_subscription_states_table(metadata),
        webhook_reported_table(metadata),
    )
