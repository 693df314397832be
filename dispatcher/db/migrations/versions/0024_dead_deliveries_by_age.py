"""webhooks: dead deliveries by the time they died, for their removal

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07

The sender removes a dead delivery ``webhooks.dead_kept_days`` after it died
(``dispatcher.webhooks.deliveries.purge_dead``), the oldest first: a range of this
partial index, whatever else the table holds (the pending deliveries, the dead ones
still kept, which the console pages through by ``ix_webhook_deliveries_dead``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_webhook_deliveries_dead_since",
        "webhook_deliveries",
        ["updated_at"],
        postgresql_where=sa.text("status = 'dead'"),
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_dead_since", table_name="webhook_deliveries")
