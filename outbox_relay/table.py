"""The outbox table, its relay companions, and the rows written into it.

Any service can own an outbox: it adds :func:`outbox_table` to its metadata (and
migrations) and inserts :meth:`OutboxMessage.row` values in the same transaction as its
own state change. The relay then publishes each row at least once.

Besides the outbox ``name`` itself, :func:`outbox_table` defines three small tables the
relay coordinates through: ``<name>_lanes`` (one lease per key-hash lane),
``<name>_relays`` (live relay instances, so lanes can be shared out fairly) and
``<name>_listeners`` (the idle relays listening for inserts). The schema also needs a
trigger that notifies :func:`notify_channel` on insert while a relay listens; the
service's migration creates it (see ``outbox_relay/README.md``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Computed,
    DateTime,
    Identity,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

CLOUDEVENTS_SPEC_VERSION = "1.0"

DEFAULT_LANES = 64
"""Key-hash lanes of an outbox. Fixed by the schema (the ``lane`` column's expression
and the rows of ``<name>_lanes``), so every relay instance agrees on it."""


def lane_expression(lanes: int = DEFAULT_LANES) -> str:
    """SQL that maps a row's key to its lane; the same key always lands in one lane."""
    # bigint before abs(): abs() of the smallest int4 overflows.
    return f"abs(hashtext(key)::bigint) % {lanes}"


def lanes_table_name(name: str) -> str:
    """The lease table of outbox ``name``."""
    return f"{name}_lanes"


def relays_table_name(name: str) -> str:
    """The membership table of outbox ``name``."""
    return f"{name}_relays"


def listeners_table_name(name: str) -> str:
    """The table of outbox ``name``'s relays that listen for inserts (idle ones)."""
    return f"{name}_listeners"


def notify_channel(name: str) -> str:
    """The LISTEN/NOTIFY channel the insert trigger of outbox ``name`` signals."""
    return f"{name}_inserted"


def outbox_table(metadata: MetaData, name: str = "outbox", lanes: int = DEFAULT_LANES) -> Table:
    """Define the outbox table ``name`` (and its lane and relay tables) on ``metadata``."""
    Table(
        lanes_table_name(name),
        metadata,
        Column("lane", SmallInteger, primary_key=True, autoincrement=False),
        Column("owner", Text),
        Column("expires_at", DateTime(timezone=True)),
        Column("heartbeat_at", DateTime(timezone=True)),
        # Bumped on every change of owner: tells a log reader which tenure a batch was in.
        Column("epoch", BigInteger, nullable=False, server_default=text("0")),
    )
    Table(
        relays_table_name(name),
        metadata,
        Column("relay_id", Text, primary_key=True),
        Column("heartbeat_at", DateTime(timezone=True), nullable=False),
        Column("expires_at", DateTime(timezone=True), nullable=False),
    )
    # An idle relay's row, renewed while it listens and deleted when it stops: the
    # insert trigger notifies only while one is here (outbox_relay.wakeup).
    Table(
        listeners_table_name(name),
        metadata,
        Column("relay_id", Text, primary_key=True),
        Column("until", DateTime(timezone=True), nullable=False),
    )
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
        Column("lane", SmallInteger, Computed(lane_expression(lanes), persisted=True)),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column("last_error", Text),
        Column("dead_lettered_at", DateTime(timezone=True)),
        Index(f"ix_{name}_unpublished", "id", postgresql_where=text("published_at IS NULL")),
        # Small by construction: only rows an operator still has to look at.
        Index(
            f"ix_{name}_dead_letters",
            "key",
            postgresql_where=text("dead_lettered_at IS NOT NULL"),
        ),
        Index(
            f"ix_{name}_published_at",
            "published_at",
            postgresql_where=text("published_at IS NOT NULL"),
        ),
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
