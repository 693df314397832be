"""console sessions: a row per signed-in console session, so signing out ends it

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05

The console's cookie was the whole session: signing out cleared it in the browser, but
a copy of it opened the console until it expired. A session is now live while its row
is; sign-out deletes the row, on whichever API replica it lands. Sessions signed in
before the upgrade have no row: their operators sign in again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("session_hash", sa.Text(), nullable=False),
        sa.Column("key_hash", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_hash"),
    )
    op.create_index("ix_console_sessions_expires_at", "console_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_console_sessions_expires_at", table_name="console_sessions")
    op.drop_table("console_sessions")
