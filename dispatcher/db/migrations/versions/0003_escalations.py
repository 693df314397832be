"""escalations; compensation requests; reconcile-due index covers accepted calls

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "escalations",
        sa.Column("escalation_id", sa.Text(), nullable=False),
        sa.Column("tool_call_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("episode", sa.Integer(), nullable=False),
        sa.Column("status", sa.Text(), server_default="open", nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("acknowledged_by", sa.Text(), nullable=True),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolved_by", sa.Text(), nullable=True),
        sa.Column("finding", sa.Text(), nullable=True),
        sa.Column("resolution_reason", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('open', 'acknowledged', 'resolved')", name="ck_escalations_status"
        ),
        sa.CheckConstraint(
            "finding IS NULL OR finding IN ('confirmed_success', 'confirmed_failure', 'compensated')",
            name="ck_escalations_finding",
        ),
        sa.PrimaryKeyConstraint("escalation_id"),
        sa.UniqueConstraint("tool_call_id", "episode", name="uq_escalations_call_episode"),
    )
    op.create_index(
        "ix_escalations_tenant_status",
        "escalations",
        ["tenant", "status", "created_at"],
        unique=False,
    )
    op.add_column(
        "tool_calls",
        sa.Column("compensation_requested_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.drop_index(
        "ix_tool_calls_unknown_due",
        table_name="tool_calls",
        postgresql_where=sa.text("status = 'result_unknown'"),
    )
    op.create_index(
        "ix_tool_calls_reconcile_due",
        "tool_calls",
        ["next_reconcile_at"],
        unique=False,
        postgresql_where=sa.text("reconciliation_status = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_tool_calls_reconcile_due",
        table_name="tool_calls",
        postgresql_where=sa.text("reconciliation_status = 'pending'"),
    )
    op.create_index(
        "ix_tool_calls_unknown_due",
        "tool_calls",
        ["next_reconcile_at"],
        unique=False,
        postgresql_where=sa.text("status = 'result_unknown'"),
    )
    op.drop_column("tool_calls", "compensation_requested_at")
    op.drop_index("ix_escalations_tenant_status", table_name="escalations")
    op.drop_table("escalations")
