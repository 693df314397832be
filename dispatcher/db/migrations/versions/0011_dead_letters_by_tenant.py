"""outbox: a tenant's dead letters in id order, by an index of their own

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

A tenant lists its dead letters a page at a time, after a cursor, oldest first
(``GET /v1/outbox/dead-letters``, the console's outbox page). The partial index on the
dead letters' key serves the relay, not this order: with stale statistics the planner
walked the primary key through the whole published history instead (840,000 rows
filtered for the first page of a million-row outbox). This index holds only dead
letters, by tenant and id, so a page reads its own rows and stops.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_outbox_dead_letters_tenant",
        "outbox",
        [sa.text("(payload ->> 'tenant')"), "id"],
        postgresql_where=sa.text("dead_lettered_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_dead_letters_tenant", table_name="outbox")
