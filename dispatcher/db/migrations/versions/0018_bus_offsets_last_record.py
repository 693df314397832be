"""bus intake: a fingerprint of the last recorded record of each partition

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06

A partition's recorded offset only means "recorded" for the log it was taken from. A
request topic deleted and made again (by mistake, or by a broker that lost its data)
starts again at offset 0, and every new record below the old offset would be skipped
as recorded. The fingerprint of the record just below the offset lets bus intake tell
a redelivery of the same log (the record is there, the same) from a new log
(``dispatcher.bus.continuity``). Null for rows recorded before it existed: trusted.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("bus_offsets", sa.Column("last_record", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    op.drop_column("bus_offsets", "last_record")
