"""outbox: notify on insert only while a relay listens

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07

Every transaction that inserted into the outbox sent a notification, and PostgreSQL
takes one lock for all of a database's notifying commits, held until each one's WAL
is flushed: under a stream of submissions, commits queued behind each other instead
of sharing a flush. A relay reading that stream does not listen anyway (it reads again
every ``read_interval``), so the notifications were paid for and never heard. Now an
idle relay that listens keeps a row in ``outbox_listeners`` (``outbox_relay.wakeup``),
and the trigger notifies only while one is there. Relays of an earlier release keep no
such row: until they are replaced, an idle one finds new rows at its next poll
(``poll_interval``, 1 s by default) rather than at once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

# Frozen copies, as in 0002: the channel of outbox_relay.table.notify_channel("outbox").
CHANNEL = "outbox_inserted"
_LISTENING = "EXISTS (SELECT 1 FROM outbox_listeners WHERE until > now())"


def _notify_function(body: str) -> str:
    return f"""
        CREATE OR REPLACE FUNCTION outbox_notify_relay() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            {body}
            RETURN NULL;
        END $$;
        """


def upgrade() -> None:
    op.create_table(
        "outbox_listeners",
        sa.Column("relay_id", sa.Text(), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("relay_id"),
    )
    # A listener's row lapses at `until` unless renewed: one left by a relay that died
    # stops the notifications then. now() is the transaction's start: a long
    # transaction may notify for a row that lapsed since, which only wakes a relay.
    op.execute(
        _notify_function(f"IF {_LISTENING} THEN PERFORM pg_notify('{CHANNEL}', ''); END IF;")
    )


def downgrade() -> None:
    op.execute(_notify_function(f"PERFORM pg_notify('{CHANNEL}', '');"))
    op.drop_table("outbox_listeners")
