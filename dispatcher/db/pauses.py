"""The capability pause tables: ``capability_states`` (the current state of each scope
ever paused: a capability for one tenant, or for every tenant as ``tenant = ''``) and
``capability_events`` (every pause and resume, append-only), and ``capability_breakers``
(the circuit breaker of each capability that has failed)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from dispatcher.states import BreakerState, CapabilityStatus

EVERY_TENANT = ""
"""The ``tenant`` of a pause that holds every tenant's calls."""


def capability_states_table(metadata: MetaData) -> Table:
    return Table(
        "capability_states",
        metadata,
        Column("capability_id", Text, nullable=False),
        Column("tenant", Text, nullable=False),
        Column("status", Text, nullable=False),
        Column("reason", Text, nullable=False),
        Column("actor", JSONB, nullable=False),
        Column("changed_at", DateTime(timezone=True), nullable=False),
        # When it was last resumed: its waiting calls are re-driven from then on
        # (dispatcher.worker.redrive), without waiting out the lost-command threshold.
        Column("resumed_at", DateTime(timezone=True)),
        Column("version", Integer, nullable=False, server_default="1"),
        PrimaryKeyConstraint("capability_id", "tenant", name="capability_states_pkey"),
        # As dispatcher.db.tables.status_check builds them (a test holds them to the enum).
        CheckConstraint(
            "status IN ({})".format(", ".join(f"'{s.value}'" for s in CapabilityStatus)),
            name="ck_capability_states_status",
        ),
        Index(
            "ix_capability_states_paused",
            "tenant",
            "capability_id",
            postgresql_where=text("status = 'paused'"),
        ),
        Index(
            "ix_capability_states_resumed",
            "resumed_at",
            postgresql_where=text("status = 'active'"),
        ),
    )


def capability_events_table(metadata: MetaData) -> Table:
    return Table(
        "capability_events",
        metadata,
        Column("seq", BigInteger, Identity(), nullable=False),
        Column("event_id", Text, nullable=False),
        Column("event_type", Text, nullable=False),
        Column("capability_id", Text, nullable=False),
        Column("tenant", Text, nullable=False),
        Column("actor", JSONB, nullable=False),
        Column("reason", Text, nullable=False),
        Column("occurred_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        PrimaryKeyConstraint("seq", name="capability_events_pkey"),
        UniqueConstraint("event_id", name="uq_capability_events_event_id"),
        Index("ix_capability_events_capability", "capability_id", "seq"),
    )


def capability_breakers_table(metadata: MetaData) -> Table:
    """A capability's circuit breaker (one row once it has failed; a handful of rows)."""
    return Table(
        "capability_breakers",
        metadata,
        Column("capability_id", Text, nullable=False),
        Column("state", Text, nullable=False, server_default="closed"),
        # Failures counted in the window that began at window_started_at.
        Column("failures", Integer, nullable=False, server_default="0"),
        Column("window_started_at", DateTime(timezone=True), nullable=False),
        # The last failures (class, HTTP status, time), newest last: an opening's
        # evidence. Never a call id: a breaker is every tenant's.
        Column("evidence", JSONB, nullable=False, server_default="[]"),
        Column("opened_at", DateTime(timezone=True)),
        # Open: when its probes may go. Half-open: when unanswered probes are given up.
        Column("probe_at", DateTime(timezone=True)),
        Column("probes_left", Integer, nullable=False, server_default="0"),
        Column("version", Integer, nullable=False, server_default="1"),
        Column("updated_at", DateTime(timezone=True), nullable=False),
        PrimaryKeyConstraint("capability_id", name="capability_breakers_pkey"),
        CheckConstraint(
            "state IN ({})".format(", ".join(f"'{s.value}'" for s in BreakerState)),
            name="ck_capability_breakers_state",
        ),
    )


def capability_tables(metadata: MetaData) -> tuple[Table, Table, Table]:
    """``capability_states``, ``capability_events`` and ``capability_breakers``."""
    return (
        capability_states_table(metadata),
        capability_events_table(metadata),
        capability_breakers_table(metadata),
    )
