"""toolCallId scoped per tenant: the call's key is (tenant, tool_call_id)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

Design: a composite primary key ``(tenant, tool_call_id)`` rather than a surrogate key
beside a per-tenant public id. The toolCallId is what every answer, event, approval,
escalation and provider request already names, so a surrogate would have to be mapped
back to it in each of them; with the composite key the stored values stay exactly as
they are, and every lookup by call id also filters by the tenant (the dispatch command
carries it). Tenant first: every lookup names it, and a tenant's calls sit together.

The approval of a call and the escalation episodes of a call are keyed the same way.
The outbox key of a dispatch command stays the bare call id: two tenants' calls with
one id then only share a partition (ordered together, never apart), and the commands
already in flight keep theirs.

Upgrade only widens keys: no row is touched. Downgrade narrows them back, which is
refused while two tenants hold one toolCallId (the old key cannot hold both).
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint("tool_calls_pkey", "tool_calls", type_="primary")
    op.create_primary_key("tool_calls_pkey", "tool_calls", ["tenant", "tool_call_id"])
    op.drop_constraint("approvals_tool_call_id_key", "approvals", type_="unique")
    op.create_unique_constraint("uq_approvals_tenant_call", "approvals", ["tenant", "tool_call_id"])
    op.drop_constraint("uq_escalations_call_episode", "escalations", type_="unique")
    op.create_unique_constraint(
        "uq_escalations_call_episode", "escalations", ["tenant", "tool_call_id", "episode"]
    )


def downgrade() -> None:
    # Fails (unique violation) rather than drop a call when two tenants share an id.
    op.drop_constraint("uq_escalations_call_episode", "escalations", type_="unique")
    op.create_unique_constraint(
        "uq_escalations_call_episode", "escalations", ["tool_call_id", "episode"]
    )
    op.drop_constraint("uq_approvals_tenant_call", "approvals", type_="unique")
    op.create_unique_constraint("approvals_tool_call_id_key", "approvals", ["tool_call_id"])
    op.drop_constraint("tool_calls_pkey", "tool_calls", type_="primary")
    op.create_primary_key("tool_calls_pkey", "tool_calls", ["tool_call_id"])
