"""tool_calls: the call's trace context and the agent tool it executes

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

``traceparent``: the W3C context the call was submitted in (intake's span when traces
are on, else the producer's own), so every later step of the call -- each dispatch
attempt, a re-drive, an operator's retry, the reconciler -- joins one trace. NULL for a
call submitted without one: its provider requests then carry a traceparent derived
from the call (dispatcher.provider.client.traceparent), as before.

``tool_name``: the agent's tool this call executes, when the producer says so
(``toolName``); its spans then carry the GenAI tool-execution attributes.

Both nullable and without defaults: adding them rewrites no row.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tool_calls", sa.Column("traceparent", sa.Text(), nullable=True))
    op.add_column("tool_calls", sa.Column("tool_name", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("tool_calls", "tool_name")
    op.drop_column("tool_calls", "traceparent")
