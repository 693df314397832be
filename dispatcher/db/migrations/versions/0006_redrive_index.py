"""redrive: index the calls that wait in authorized

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_tool_calls_authorized_since",
        "tool_calls",
        ["updated_at"],
        postgresql_where=sa.text("status = 'authorized'"),
    )


def downgrade() -> None:
    op.drop_index("ix_tool_calls_authorized_since", table_name="tool_calls")
