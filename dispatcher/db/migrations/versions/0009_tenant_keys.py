"""Keys qualified by tenant: outbox ordering keys, and the key a provider receives

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04

**Outbox keys.** A message's key was the bare ``runId`` (events) or ``toolCallId``
(commands, escalations), which two tenants may share: a dead letter of one tenant then
held back the other's rows of the same key. Every key becomes ``<tenant>/<name>``
(``dispatcher.tenancy.ordering_key``, the tenant's ``%`` and ``/`` percent-encoded).
Every row already in the outbox, published or not, is rewritten in place: ids do not
change, so each new key's rows keep their relative order, and a row still unpublished
at the upgrade stays ahead of every row written after it under the same new key. The
``lane`` column follows its key (a stored generated column). The tenant of a row is
its payload's ``tenant``, which every message of the service names; a row without one
(none is written) keeps its key.

**Provider keys.** ``provider_key`` holds the idempotency key the provider receives,
computed at intake (``dispatcher.tenancy.provider_key``). Every call already recorded
was sent, or will be, with its bare ``idempotency_key``: that is what this migration
stores for it, so an in-flight call is re-sent and looked up with the key the provider
already knows.

Run with the relays stopped or running: a relay that read a row under its old key and
publishes it after the upgrade sends it once more under the new one (at least once, as
always); consumers drop the copy by ``ce_id``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# dispatcher.tenancy.ordering_key_sql as of this revision, frozen here: a migration
# must do what it did on the day it was written.
_TENANT = "payload ->> 'tenant'"
_ESCAPED = f"replace(replace({_TENANT}, '%', '%25'), '/', '%2F')"


def upgrade() -> None:
    op.add_column("tool_calls", sa.Column("provider_key", sa.Text(), nullable=True))
    op.execute("UPDATE tool_calls SET provider_key = idempotency_key")
    op.alter_column("tool_calls", "provider_key", nullable=False)
    op.execute(f"UPDATE outbox SET key = {_ESCAPED} || '/' || key WHERE payload ? 'tenant'")  # noqa: S608 - constant text


def downgrade() -> None:
    # The rows' keys lose their tenant again (constant text, no value in it).
    stripped = f"substr(key, char_length({_ESCAPED}) + 2)"
    mine = f"payload ? 'tenant' AND starts_with(key, {_ESCAPED} || '/')"
    op.execute(f"UPDATE outbox SET key = {stripped} WHERE {mine}")  # noqa: S608
    op.drop_column("tool_calls", "provider_key")
