"""capability pauses: the current state of each paused scope, and its log of facts

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06

An operator pauses a capability (for one tenant, or for every tenant) while its provider
is down: its calls wait in ``authorized``. ``capability_states`` holds one row per scope
ever paused (a handful: it does not grow with traffic), moved only by conditional
UPDATEs (``dispatcher.ledger.pauses``); ``capability_events`` is the append-only log of
every pause and resume, with who and why. ``tenant = ''`` is every tenant.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "capability_states",
        sa.Column("capability_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", JSONB(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resumed_at", sa.DateTime(timezone=True)),
        sa.Column("version", sa.Integer(), nullable=False, server_default="1"),
        sa.PrimaryKeyConstraint("capability_id", "tenant", name="capability_states_pkey"),
        sa.CheckConstraint("status IN ('active', 'paused')", name="ck_capability_states_status"),
    )
    op.create_table(
        "capability_events",
        sa.Column("seq", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("event_id", sa.Text(), nullable=False),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("capability_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("actor", JSONB(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "occurred_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("seq", name="capability_events_pkey"),
        sa.UniqueConstraint("event_id", name="uq_capability_events_event_id"),
    )
    # The paused scopes of a tenant (every page of the console names them): the live
    # set only, whatever was paused and resumed before.
    op.create_index(
        "ix_capability_states_paused",
        "capability_states",
        ["tenant", "capability_id"],
        postgresql_where=sa.text("status = 'paused'"),
    )
    # The scopes resumed lately (the workers' resume loop asks every second or two).
    op.create_index(
        "ix_capability_states_resumed",
        "capability_states",
        ["resumed_at"],
        postgresql_where=sa.text("status = 'active'"),
    )
    # The log of one capability, newest first (the console's history of a capability).
    op.create_index(
        "ix_capability_events_capability", "capability_events", ["capability_id", "seq"]
    )


def downgrade() -> None:
    op.drop_table("capability_events")
    op.drop_table("capability_states")
