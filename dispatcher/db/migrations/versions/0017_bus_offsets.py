"""bus intake: the recorded offset of each request topic's partition

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05

Bus intake (``tool-dispatcher bus-intake``) records a fetched batch of request records
and moves its partitions' offsets in one transaction (``dispatcher.db.bus_offsets``):
a record delivered again is skipped, so it is recorded exactly once whoever consumes
it. One row per partition: the table does not grow with traffic.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bus_offsets",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("next_offset", sa.BigInteger(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("topic", "partition", name="bus_offsets_pkey"),
    )


def downgrade() -> None:
    op.drop_table("bus_offsets")
