"""circuit breakers: one row per capability whose provider has failed lately

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06

A capability's breaker is shared by every worker: its state lives here, so N workers
agree and a restarted one knows it. A row exists only for a capability that has failed
at least once (a handful of rows: it does not grow with traffic), moved only by
conditional statements (``dispatcher.ledger.breakers``). Opening pauses the capability
for every tenant (``capability_states``); its facts are ``capability_events`` rows.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "capability_breakers",
        sa.Column("capability_id", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False, server_default="closed"),
        # Failures counted in the window that began at window_started_at.
        sa.Column("failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("window_started_at", sa.DateTime(timezone=True), nullable=False),
        # The last failures, newest last (their class, HTTP status, time): the evidence
        # an opening names. Never a call id: a breaker is every tenant's.
        sa.Column("evidence", JSONB(), nullable=False, server_default="[]"),
        sa.Column("opened_at", sa.DateTime(timezone=True)),
        # When an open breaker may let its probes through.
        sa.Column("probe_at", sa.DateTime(timezone=True)),
        # Probe calls a half-open breaker may still claim.
        sa.Column("probes_left", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("version", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("capability_id", name="capability_breakers_pkey"),
        sa.CheckConstraint(
            "state IN ('closed', 'open', 'half_open')", name="ck_capability_breakers_state"
        ),
    )


def downgrade() -> None:
    op.drop_table("capability_breakers")
