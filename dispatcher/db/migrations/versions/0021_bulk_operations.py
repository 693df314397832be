"""bulk operations: an operator's command over every call a filter selects

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06

Retrying five thousand failed calls one request at a time is an afternoon of scripts
that stop halfway. An operation is a row (``bulk_operations``) worked through in
batches: each batch's calls move in the transaction that advances the row's keyset
cursor and counts, and records each call it touched in ``bulk_operation_calls``,
whose primary key makes a call touched at most once per operation, so a processor
killed mid-batch is resumed by another without touching anything twice.

``ix_tool_calls_operable`` holds the failed and escalated calls in the order a batch
reads them (tenant, status, last change, id): a batch is a range of it, and never
reads the completed calls of the history around them. Only calls entering those two
states write to it; intake does not.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bulk_operations",
        sa.Column("operation_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("filter", JSONB(), nullable=False),
        sa.Column("params", JSONB(), nullable=False),
        sa.Column("actor", JSONB(), nullable=False),
        sa.Column("idempotency_key", sa.Text()),
        sa.Column("state", sa.Text(), nullable=False, server_default="running"),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("failed", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("cursor", JSONB()),
        sa.Column("lease_owner", sa.Text()),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True)),
        sa.Column("cancelled_by", JSONB()),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("operation_id", name="bulk_operations_pkey"),
        sa.UniqueConstraint("tenant", "idempotency_key", name="uq_bulk_operations_tenant_key"),
        sa.CheckConstraint(
            "state IN ('running', 'completed', 'cancelled')", name="ck_bulk_operations_state"
        ),
    )
    op.create_index(
        "ix_bulk_operations_running",
        "bulk_operations",
        ["lease_expires_at"],
        postgresql_where=sa.text("state = 'running'"),
    )
    op.create_table(
        "bulk_operation_calls",
        sa.Column("operation_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("tool_call_id", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("code", sa.Text()),
        sa.Column("detail", sa.Text()),
        sa.Column("event_id", sa.Text()),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint(
            "operation_id", "tenant", "tool_call_id", name="bulk_operation_calls_pkey"
        ),
        sa.CheckConstraint(
            "outcome IN ('done', 'refused')", name="ck_bulk_operation_calls_outcome"
        ),
    )
    op.create_index(
        "ix_tool_calls_operable",
        "tool_calls",
        ["tenant", "status", "updated_at", "tool_call_id"],
        postgresql_where=sa.text("status IN ('escalated', 'failed')"),
    )


def downgrade() -> None:
    op.drop_index("ix_tool_calls_operable", table_name="tool_calls")
    op.drop_table("bulk_operation_calls")
    op.drop_index("ix_bulk_operations_running", table_name="bulk_operations")
    op.drop_table("bulk_operations")
