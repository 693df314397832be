"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "execution_events",
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("event_id", sa.Text(), nullable=False),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("turn_id", sa.Text(), nullable=True),
        sa.Column("producer", sa.Text(), nullable=False),
        sa.Column("reasoning_object_id", sa.Text(), nullable=True),
        sa.Column("capability_id", sa.Text(), nullable=True),
        sa.Column("correlation_id", sa.Text(), nullable=True),
        sa.Column("causation_id", sa.Text(), nullable=True),
        sa.Column("tool_call_id", sa.Text(), nullable=True),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "payload",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("event_id"),
    )
    op.create_index(
        "ix_execution_events_run", "execution_events", ["tenant", "run_id", "seq"], unique=False
    )
    op.create_index(
        "ix_execution_events_tool_call", "execution_events", ["tool_call_id", "seq"], unique=False
    )

    # The event log is append-only by the database's own rule, not by convention:
    # any UPDATE, DELETE or TRUNCATE of a recorded fact is an error.
    op.execute(
        """
        CREATE FUNCTION execution_events_append_only() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'execution_events is append-only (% refused)', TG_OP
                USING ERRCODE = 'insufficient_privilege';
        END $$;
        """
    )
    op.execute(
        "CREATE TRIGGER execution_events_no_update_delete BEFORE UPDATE OR DELETE "
        "ON execution_events FOR EACH ROW EXECUTE FUNCTION execution_events_append_only()"
    )
    op.execute(
        "CREATE TRIGGER execution_events_no_truncate BEFORE TRUNCATE "
        "ON execution_events FOR EACH STATEMENT EXECUTE FUNCTION execution_events_append_only()"
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "headers",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_outbox_unpublished",
        "outbox",
        ["id"],
        unique=False,
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.create_table(
        "tool_calls",
        sa.Column("tool_call_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("turn_id", sa.Text(), nullable=True),
        sa.Column("capability_id", sa.Text(), nullable=False),
        sa.Column("input", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("request_fingerprint", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("verification_status", sa.Text(), server_default="not_observed", nullable=False),
        sa.Column("reconciliation_status", sa.Text(), server_default="not_needed", nullable=False),
        sa.Column("external_request_id", sa.Text(), nullable=True),
        sa.Column("correlation_id", sa.Text(), nullable=True),
        sa.Column("causation_id", sa.Text(), nullable=True),
        sa.Column("reasoning_object_id", sa.Text(), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("accepted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("result_ref", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("dispatch_attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("reconcile_attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_reconcile_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("version", sa.Integer(), server_default="1", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "reconciliation_status IN ('not_needed', 'pending', 'settled', 'escalated')",
            name="ck_tool_calls_reconciliation",
        ),
        sa.CheckConstraint(
            "status IN ('proposed', 'authorized', 'dispatching', 'accepted', 'completed', 'failed', 'result_unknown', 'confirmed', 'compensated', 'escalated', 'rejected', 'cancelled')",
            name="ck_tool_calls_status",
        ),
        sa.CheckConstraint(
            "verification_status IN ('not_observed', 'pending', 'confirmed_success', 'confirmed_failure', 'inconclusive')",
            name="ck_tool_calls_verification",
        ),
        sa.CheckConstraint(
            "char_length(idempotency_key) BETWEEN 1 AND 255", name="ck_tool_calls_key_length"
        ),
        sa.PrimaryKeyConstraint("tool_call_id"),
        sa.UniqueConstraint(
            "tenant", "idempotency_key", name="uq_tool_calls_tenant_idempotency_key"
        ),
    )
    op.create_index(
        "ix_tool_calls_dispatching_lease",
        "tool_calls",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("status = 'dispatching'"),
    )
    op.create_index(
        "ix_tool_calls_run", "tool_calls", ["tenant", "run_id", "created_at"], unique=False
    )
    op.create_index(
        "ix_tool_calls_unknown_due",
        "tool_calls",
        ["next_reconcile_at"],
        unique=False,
        postgresql_where=sa.text("status = 'result_unknown'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_tool_calls_unknown_due",
        table_name="tool_calls",
        postgresql_where=sa.text("status = 'result_unknown'"),
    )
    op.drop_index("ix_tool_calls_run", table_name="tool_calls")
    op.drop_index(
        "ix_tool_calls_dispatching_lease",
        table_name="tool_calls",
        postgresql_where=sa.text("status = 'dispatching'"),
    )
    op.drop_table("tool_calls")
    op.drop_index(
        "ix_outbox_unpublished",
        table_name="outbox",
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.drop_table("outbox")
    op.drop_index("ix_execution_events_tool_call", table_name="execution_events")
    op.drop_index("ix_execution_events_run", table_name="execution_events")
    op.drop_table("execution_events")
    op.execute("DROP FUNCTION execution_events_append_only()")
