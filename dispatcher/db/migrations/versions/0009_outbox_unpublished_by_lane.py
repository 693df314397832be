"""outbox: index the unpublished rows by lane, then id

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

The relay reads each of its lanes with an index scan of ``(lane, id)`` that stops at
its batch size (``outbox_relay.queries``, "claim"), instead of one bitmap scan of every
unpublished row. The new index replaces ``ix_outbox_unpublished`` (``id``), which no
statement needs any more: one index fewer to write for every outbox row.

Both are built and dropped CONCURRENTLY, outside the migration's transaction: a plain
CREATE INDEX scans the whole table (published rows kept for retention included) while
it blocks every insert, so every intake, for as long as that takes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_outbox_unpublished_by_lane",
            "outbox",
            ["lane", "id"],
            postgresql_where=sa.text("published_at IS NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.drop_index(
            "ix_outbox_unpublished",
            table_name="outbox",
            postgresql_concurrently=True,
            if_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_outbox_unpublished",
            "outbox",
            ["id"],
            postgresql_where=sa.text("published_at IS NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.drop_index(
            "ix_outbox_unpublished_by_lane",
            table_name="outbox",
            postgresql_concurrently=True,
            if_exists=True,
        )
