"""The outbox table and the rows written into it.

Any service can own an outbox: it adds :func:`outbox_table` to its metadata (and
migrations) and inserts :func:`outbox_row` values in the same transaction as its
own state change. The relay then publishes each row at least once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Identity,
    Index,
    MetaData,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

CLOUDEVENTS_SPEC_VERSION = "1.0"


def outbox_table(metadata: MetaData, name: str = "outbox") -> Table:
    """Define the outbox table ``name`` on ``metadata``."""
    return Table(
        name,
        metadata,
        Column("id", BigInteger, Identity(always=True), primary_key=True),
        Column("topic", Text, nullable=False),
        Column("key", Text, nullable=False),
        Column("payload", JSONB, nullable=False),
        Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("published_at", DateTime(timezone=True), nullable=True),
        Index(f"ix_{name}_unpublished", "id", postgresql_where=text("published_at IS NULL")),
    )


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """One message to publish. ``type`` and ``source`` become CloudEvents attributes;
    the id is fixed here, at write time, so every re-publish carries the same one."""

    topic: str
    key: str
    type: str
    source: str
    payload: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    message_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    time: datetime = field(default_factory=lambda: datetime.now(UTC))

    def row(self) -> dict[str, Any]:
        """Column values for an INSERT into an outbox table."""
        return {
            "topic": self.topic,
            "key": self.key,
            "payload": self.payload,
            "headers": {
                **self.headers,
                "ce_id": self.message_id,
                "ce_type": self.type,
                "ce_source": self.source,
                "ce_specversion": CLOUDEVENTS_SPEC_VERSION,
                "ce_time": self.time.isoformat(),
            },
        }
