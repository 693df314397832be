"""webhooks: notifications written with their facts, deliveries per subscription

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06

``webhook_notifications`` is written in the transaction of the fact it reports
(``dispatcher.webhooks.notify``) and emptied by the sender's fan-out into
``webhook_deliveries``, one row per subscription, whose pending rows are the live set
(``ix_webhook_deliveries_due``) and whose dead ones are a tenant's console page
(``ix_webhook_deliveries_dead``). ``webhook_subscription_states`` holds each
subscription's backoff; ``webhook_reported`` what a sweep reported once (an outbox dead
letter, an approval about to expire).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def _now() -> sa.sql.elements.TextClause:
    return sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "webhook_notifications",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("notification_id", sa.Text(), nullable=False),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text()),
        sa.Column("data", JSONB(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("id", name="webhook_notifications_pkey"),
        sa.UniqueConstraint("notification_id", name="uq_webhook_notifications_notification_id"),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("delivery_id", sa.Text(), nullable=False),
        sa.Column("notification_id", sa.Text(), nullable=False),
        sa.Column("subscription_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("leased_by", sa.Text()),
        sa.Column("last_error", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.PrimaryKeyConstraint("delivery_id", name="webhook_deliveries_pkey"),
        sa.UniqueConstraint("seq", name="uq_webhook_deliveries_seq"),
        sa.CheckConstraint("status IN ('pending', 'dead')", name="ck_webhook_deliveries_status"),
    )
    # The due deliveries of each subscription: the sender's every claim reads the
    # pending rows only, a range per subscription.
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["subscription_id", "next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    # A tenant's dead deliveries, newest first by cursor (the console's page).
    op.create_index(
        "ix_webhook_deliveries_dead",
        "webhook_deliveries",
        ["tenant", "seq"],
        postgresql_where=sa.text("status = 'dead'"),
    )
    op.create_table(
        "webhook_subscription_states",
        sa.Column("subscription_id", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("retry_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("subscription_id", name="webhook_subscription_states_pkey"),
    )
    op.create_table(
        "webhook_reported",
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("ref", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("kind", "ref", name="webhook_reported_pkey"),
    )


def downgrade() -> None:
    op.drop_table("webhook_reported")
    op.drop_table("webhook_subscription_states")
    op.drop_index("ix_webhook_deliveries_dead", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_notifications")
