"""indexes for bounded repeated reads: the live set of calls, lists in their own order,
the redrive sweep's outbox check

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04

Every query a process or a page repeats reads the live set or one page, whatever the
history behind it (checked by the plans in ``tests/*/test_*_plans.py`` on 50,000 calls
of history):

- ``ix_tool_calls_in_flight``: the calls not yet finished, by tenant and status. The
  ``tool_dispatcher_calls`` gauge and the console's overview count these; a finished
  call leaves the index as it leaves the set, so the index is as big as the live set.
- Escalations and approvals by their lists' order (tenant or not, status, then age, then
  id as the tie-break), so a page is a range of one index read after its cursor, never
  a sort of the tenant's whole history. The two old (tenant, status, created_at) indexes
  become (..., expires_at | created_at, id): the lists never sorted approvals by
  created_at, and a tie on created_at (one reconciler batch escalates many calls in one
  transaction, under one now()) needs the id to order a page.
- ``ix_outbox_dispatch_commands``: the dispatch commands by key, the question the
  redrive sweep asks during an incident (is a command for this call waiting, or
  recent?). Partial on the message type, which the code fixes (the topic is a
  setting): one message in seven is a command, so the index costs one entry in seven.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# The migration's own copy of dispatcher.states.IN_FLIGHT_STATES (a test holds the
# index's predicate to the enum).
_IN_FLIGHT = (
    "status IN ('proposed', 'authorized', 'dispatching', 'accepted', 'result_unknown', 'escalated')"
)


def upgrade() -> None:
    op.create_index(
        "ix_tool_calls_in_flight",
        "tool_calls",
        ["tenant", "status"],
        postgresql_where=sa.text(_IN_FLIGHT),
    )
    op.drop_index("ix_escalations_tenant_status", table_name="escalations")
    op.create_index(
        "ix_escalations_tenant_status",
        "escalations",
        ["tenant", "status", "created_at", "escalation_id"],
    )
    op.create_index(
        "ix_escalations_status", "escalations", ["status", "created_at", "escalation_id"]
    )
    op.drop_index("ix_approvals_tenant_status", table_name="approvals")
    op.create_index(
        "ix_approvals_tenant_status",
        "approvals",
        ["tenant", "status", "expires_at", "approval_id"],
    )
    op.create_index(
        "ix_approvals_tenant_expiry", "approvals", ["tenant", "expires_at", "approval_id"]
    )
    op.create_index(
        "ix_outbox_dispatch_commands",
        "outbox",
        ["key"],
        postgresql_where=sa.text("(headers ->> 'ce_type') = 'tool.call.dispatch'"),
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_dispatch_commands", table_name="outbox")
    op.drop_index("ix_approvals_tenant_expiry", table_name="approvals")
    op.drop_index("ix_approvals_tenant_status", table_name="approvals")
    op.create_index("ix_approvals_tenant_status", "approvals", ["tenant", "status", "created_at"])
    op.drop_index("ix_escalations_status", table_name="escalations")
    op.drop_index("ix_escalations_tenant_status", table_name="escalations")
    op.create_index(
        "ix_escalations_tenant_status", "escalations", ["tenant", "status", "created_at"]
    )
    op.drop_index("ix_tool_calls_in_flight", table_name="tool_calls")
