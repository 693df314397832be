"""approvals; runs (stop command)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "approvals",
        sa.Column("approval_id", sa.Text(), nullable=False),
        sa.Column("tool_call_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("capability_id", sa.Text(), nullable=False),
        sa.Column("risk", sa.Text(), nullable=False),
        sa.Column("input_hash", sa.Text(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("requested_by", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decision", sa.Text(), nullable=True),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.Column("decision_reason", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'approved', 'rejected', 'expired', 'cancelled')",
            name="ck_approvals_status",
        ),
        sa.CheckConstraint(
            "decision IS NULL OR decision IN ('approve', 'reject')", name="ck_approvals_decision"
        ),
        sa.CheckConstraint(
            "(decision IS NOT NULL) = (status IN ('approved', 'rejected'))",
            name="ck_approvals_decided",
        ),
        sa.CheckConstraint(
            "(closed_at IS NULL) = (status = 'pending')", name="ck_approvals_closed"
        ),
        sa.PrimaryKeyConstraint("approval_id"),
        sa.UniqueConstraint("tool_call_id"),
    )
    op.create_index(
        "ix_approvals_tenant_status", "approvals", ["tenant", "status", "created_at"], unique=False
    )
    op.create_index(
        "ix_approvals_pending_expiry",
        "approvals",
        ["expires_at"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_table(
        "runs",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stopped_by", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("tenant", "run_id"),
    )


def downgrade() -> None:
    op.drop_table("runs")
    op.drop_index(
        "ix_approvals_pending_expiry",
        table_name="approvals",
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.drop_index("ix_approvals_tenant_status", table_name="approvals")
    op.drop_table("approvals")
