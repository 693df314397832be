"""outbox relay: lanes, leases, dead letters, insert notification

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Frozen copies of outbox_relay.table's values for the "outbox" table: a migration
# must keep creating the same schema even if that module changes later.
LANES = 64
LANE_EXPRESSION = f"abs(hashtext(key)::bigint) % {LANES}"
CHANNEL = "outbox_inserted"


def upgrade() -> None:
    op.add_column(
        "outbox",
        sa.Column(
            "lane", sa.SmallInteger(), sa.Computed(LANE_EXPRESSION, persisted=True), nullable=True
        ),
    )
    op.add_column(
        "outbox", sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.add_column("outbox", sa.Column("last_error", sa.Text(), nullable=True))
    op.add_column(
        "outbox", sa.Column("dead_lettered_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index(
        "ix_outbox_dead_letters",
        "outbox",
        ["key"],
        unique=False,
        postgresql_where=sa.text("dead_lettered_at IS NOT NULL"),
    )
    op.create_index(
        "ix_outbox_published_at",
        "outbox",
        ["published_at"],
        unique=False,
        postgresql_where=sa.text("published_at IS NOT NULL"),
    )
    op.create_table(
        "outbox_lanes",
        sa.Column("lane", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("epoch", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("lane"),
    )
    op.execute(f"INSERT INTO outbox_lanes (lane) SELECT generate_series(0, {LANES - 1})")
    op.create_table(
        "outbox_relays",
        sa.Column("relay_id", sa.Text(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("relay_id"),
    )
    # One notification per inserting statement, delivered at commit: the relay wakes
    # exactly when there is something new it can see. Identical notifications of one
    # transaction are folded into one by PostgreSQL.
    op.execute(
        f"""
        CREATE FUNCTION outbox_notify_relay() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', '');
            RETURN NULL;
        END $$;
        """
    )
    op.execute(
        "CREATE TRIGGER outbox_notify_relay AFTER INSERT ON outbox "
        "FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify_relay()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_notify_relay ON outbox")
    op.execute("DROP FUNCTION outbox_notify_relay()")
    op.drop_table("outbox_relays")
    op.drop_table("outbox_lanes")
    op.drop_index(
        "ix_outbox_published_at",
        table_name="outbox",
        postgresql_where=sa.text("published_at IS NOT NULL"),
    )
    op.drop_index(
        "ix_outbox_dead_letters",
        table_name="outbox",
        postgresql_where=sa.text("dead_lettered_at IS NOT NULL"),
    )
    op.drop_column("outbox", "dead_lettered_at")
    op.drop_column("outbox", "last_error")
    op.drop_column("outbox", "attempts")
    op.drop_column("outbox", "lane")
