"""webhooks: who sent a dead delivery again, and when

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07

The console's "Send again" moved a dead delivery back to pending and kept no trace of
who did it; a delivery that died again told the next operator nothing. Two nullable
columns, set by ``dispatcher.webhooks.deliveries.redeliver``: adding them rewrites
nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("webhook_deliveries", sa.Column("redelivered_by", sa.Text()))
    op.add_column("webhook_deliveries", sa.Column("redelivered_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("webhook_deliveries", "redelivered_at")
    op.drop_column("webhook_deliveries", "redelivered_by")
