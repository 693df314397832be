"""The dispatcher's tables (SQLAlchemy Core). The Alembic migrations create them;
``tests/ledger/test_migrations.py`` proves the two agree."""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Date,
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
from sqlalchemy.dialects.postgresql import BYTEA, JSONB

from dispatcher.db.bus_offsets import bus_offsets_table
from dispatcher.db.console_sessions import console_sessions_table
from dispatcher.db.labels import Label
from dispatcher.db.operations import bulk_operation_tables
from dispatcher.db.pauses import capability_tables
from dispatcher.db.run_summaries import run_summaries_table
from dispatcher.db.webhooks import webhook_tables
from dispatcher.states import (
    IN_FLIGHT_STATES,
    TERMINAL_STATES,
    ApprovalStatus,
    EscalationStatus,
    ExecutionStatus,
    ReconciliationStatus,
    VerificationStatus,
)
from outbox_relay import outbox_table

metadata = MetaData()


def _in(column: str, values: Iterable[StrEnum]) -> str:
    listed = ", ".join(f"'{v.value}'" for v in values)
    return f"{column} IN ({listed})"


def status_check(column: str, statuses: type[StrEnum], *, name: str) -> CheckConstraint:
    """The CHECK that ``column`` holds one of the ``statuses``. The migrations carry
    their own copy; a test holds what a migrated database admits to the enum."""
    return CheckConstraint(_in(column, statuses), name=name)


IN_FLIGHT_CALLS = text(_in("tool_calls.status", IN_FLIGHT_STATES))
"""The calls still in flight, as the predicate of ``ix_tool_calls_in_flight`` says it:
written into the statement, not bound, so every plan of a statement that uses it (a
prepared statement's generic one too) can prove that the partial index serves it."""

tool_calls = Table(
    "tool_calls",
    metadata,
    # Keyed per tenant (PrimaryKeyConstraint below): tenants' toolCallIds never meet.
    Column("tool_call_id", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("turn_id", Text),
    Column("capability_id", Text, nullable=False),
    Column("input", JSONB, nullable=False),
    Column("idempotency_key", Text, nullable=False),
    # The key the provider receives (dispatcher.tenancy.provider_key, migration 0009):
    # fixed at intake, so every send, lookup and compensation of the call uses it. NULL
    # when it is the namespaced form of idempotency_key (migration 0016): read through
    # dispatcher.tenancy.stored_provider_key.
    Column("provider_key", Text),
    # SHA-256 of the request (dispatcher.intake.keys), its 32 bytes (migration 0016).
    Column("request_fingerprint", BYTEA, nullable=False),
    Column("status", Text, nullable=False),
    Column(
        "verification_status",
        Text,
        nullable=False,
        server_default=VerificationStatus.NOT_OBSERVED.value,
    ),
    Column(
        "reconciliation_status",
        Text,
        nullable=False,
        server_default=ReconciliationStatus.NOT_NEEDED.value,
    ),
    Column("external_request_id", Text),
    Column("correlation_id", Text),
    Column("causation_id", Text),
    Column("reasoning_object_id", Text),
    # The W3C traceparent the call was submitted in (migration 0008), and the agent's
    # tool it executes when the producer named one.
    Column("traceparent", Text),
    Column("tool_name", Text),
    Column("dispatched_at", DateTime(timezone=True)),
    Column("accepted_at", DateTime(timezone=True)),
    Column("completed_at", DateTime(timezone=True)),
    Column("result", JSONB),
    Column("result_ref", Text),
    Column("last_error", Text),
    Column("dispatch_attempts", Integer, nullable=False, server_default="0"),
    Column("reconcile_attempts", Integer, nullable=False, server_default="0"),
    Column("next_reconcile_at", DateTime(timezone=True)),
    # Set when the call's effect must be undone if it happened (a stopped run, a
    # cancelled call); the reconciler compensates instead of confirming. Stopping a run
    # sets it, through dispatcher.ledger.marks.mark_for_compensation.
    Column("compensation_requested_at", DateTime(timezone=True)),
    Column("lease_owner", Text),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("version", Integer, nullable=False, server_default="1"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("tenant", "tool_call_id", name="tool_calls_pkey"),
    UniqueConstraint("tenant", "idempotency_key", name="uq_tool_calls_tenant_idempotency_key"),
    status_check("status", ExecutionStatus, name="ck_tool_calls_status"),
    status_check("verification_status", VerificationStatus, name="ck_tool_calls_verification"),
    status_check(
        "reconciliation_status", ReconciliationStatus, name="ck_tool_calls_reconciliation"
    ),
    CheckConstraint(
        "char_length(idempotency_key) BETWEEN 1 AND 255", name="ck_tool_calls_key_length"
    ),
    # A run's calls (the stop command, retention): by run only, deduplicated (0015).
    Index("ix_tool_calls_run", "tenant", "run_id"),
    # Hot-state partial indexes: the recovery sweep and the reconciler scan only these.
    Index(
        "ix_tool_calls_dispatching_lease",
        "lease_expires_at",
        postgresql_where=text(f"status = '{ExecutionStatus.DISPATCHING.value}'"),
    ),
    # Every call the reconciler follows up (result_unknown, and accepted-but-pending).
    Index(
        "ix_tool_calls_reconcile_due",
        "next_reconcile_at",
        postgresql_where=text(f"reconciliation_status = '{ReconciliationStatus.PENDING.value}'"),
    ),
    # The redrive sweep looks for calls authorized long ago (dispatcher.worker.redrive).
    Index(
        "ix_tool_calls_authorized_since",
        "updated_at",
        postgresql_where=text(f"status = '{ExecutionStatus.AUTHORIZED.value}'"),
    ),
    # Retention finds each tenant's terminal calls, oldest change first (migration 0014):
    # an entry is made when a call becomes terminal, none at intake.
    Index(
        "ix_tool_calls_terminal_since",
        "tenant",
        "updated_at",
        postgresql_where=text(_in("status", sorted(TERMINAL_STATES))),
    ),
    # The live set (migration 0012): the calls gauge and the console's overview count
    # these, so what they read does not grow with the finished calls behind them.
    Index(
        "ix_tool_calls_in_flight",
        "tenant",
        "status",
        postgresql_where=text(_in("status", IN_FLIGHT_STATES)),
    ),
)

execution_events = Table(
    "execution_events",
    metadata,
    # seq orders the log (unique by its identity; no key since migration 0015: nothing
    # looks an event up by it); event_id is the public, globally unique name of a fact
    # (random: unique by construction, dispatcher.ids; no index holds it, a lookup by id
    # names its run and reads the run's events).
    Column("seq", BigInteger, Identity(always=True), nullable=False),
    Column("event_id", Text, nullable=False),
    # Enum labels (migration 0016): 4 bytes for the few fixed strings every event had.
    Column("event_type", Label(name="execution_event_type", create_type=False), nullable=False),
    Column("tenant", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("turn_id", Text),
    Column("producer", Label(name="execution_event_producer", create_type=False), nullable=False),
    Column("reasoning_object_id", Text),
    Column("capability_id", Text),
    Column("correlation_id", Text),
    Column("causation_id", Text),
    Column("tool_call_id", Text),
    Column("schema_version", Integer, nullable=False),
    Column("occurred_at", DateTime(timezone=True), nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # A run's events, a call's: every read reads the whole run or call, so the key is
    # the run or the call alone, stored once per page with its rows' addresses (B-tree
    # deduplication; migration 0015).
    Index("ix_execution_events_run", "tenant", "run_id"),
    Index("ix_execution_events_tool_call", "tool_call_id"),
    # One partition per UTC day (migration 0014), plus a default one; retention drops a
    # day once none of its events belongs to a live call (dispatcher.retention).
    postgresql_partition_by="RANGE (occurred_at)",
)

PARTITIONS = re.compile(r"execution_events_(p\d{8}|default)")
"""The names of ``execution_events``' partitions: tables of the schema that the models
do not list (a day's is ``execution_events_pYYYYMMDD``)."""

outbox = outbox_table(metadata)
# A tenant's dead letters in id order (dispatcher.views.outbox, a page at a time): small
# by construction, and read without walking the published history or another
# tenant's dead letters (migration 0011).
Index(
    "ix_outbox_dead_letters_tenant",
    outbox.c.payload["tenant"].astext,
    outbox.c.id,
    postgresql_where=outbox.c.dead_lettered_at.is_not(None),
)

DISPATCH_TYPE = "tool.call.dispatch"
"""The CloudEvents type of a dispatch command (``dispatcher.ledger.messages.DISPATCH``)."""
DISPATCH_COMMANDS = text(f"(outbox.headers ->> 'ce_type') = '{DISPATCH_TYPE}'")
"""The outbox rows that are dispatch commands, as ``ix_outbox_dispatch_commands`` says
it (written into the statement, as :data:`IN_FLIGHT_CALLS`)."""
# The dispatch commands by key (migration 0012): the redrive sweep asks, for the calls it
# found waiting, whether a command is in flight (dispatcher.worker.redrive). Partial on
# the message type, fixed by the code, where the topic is a setting: the index holds one
# outbox row in seven.
Index(
    "ix_outbox_dispatch_commands",
    outbox.c.key,
    postgresql_where=text(f"(headers ->> 'ce_type') = '{DISPATCH_TYPE}'"),
)

escalations = Table(
    "escalations",
    metadata,
    Column("escalation_id", Text, primary_key=True),
    Column("tool_call_id", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    # 1 for the call's first escalation, 2 after an operator retry escalated again...
    Column("episode", Integer, nullable=False),
    Column("status", Text, nullable=False, server_default=EscalationStatus.OPEN.value),
    Column("reason", Text, nullable=False),
    Column("evidence", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("acknowledged_at", DateTime(timezone=True)),
    Column("acknowledged_by", Text),
    Column("resolved_at", DateTime(timezone=True)),
    Column("resolved_by", Text),
    Column("finding", Text),
    Column("resolution_reason", Text),
    # The exactly-once guarantee: one escalation (and so one published message) per
    # episode of a call, whoever races to write it.
    UniqueConstraint("tenant", "tool_call_id", "episode", name="uq_escalations_call_episode"),
    status_check("status", EscalationStatus, name="ck_escalations_status"),
    CheckConstraint(
        "finding IS NULL OR finding IN ('confirmed_success', 'confirmed_failure', 'compensated')",
        name="ck_escalations_finding",
    ),
    # The queue's order within a status, the id breaking ties (a reconciler batch
    # escalates under one now()): a keyset page is a range of one of these (migration
    # 0012), for a tenant, or for every tenant (the CLI, the open-escalations gauge).
    Index("ix_escalations_tenant_status", "tenant", "status", "created_at", "escalation_id"),
    Index("ix_escalations_status", "status", "created_at", "escalation_id"),
)

# The statuses a human decision leads to.
_DECIDED = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED)

approvals = Table(
    "approvals",
    metadata,
    Column("approval_id", Text, primary_key=True),
    # One approval per call: a decision is keyed by approval_id, so it can never answer
    # another call's approval.
    Column("tool_call_id", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("capability_id", Text, nullable=False),
    Column("risk", Text, nullable=False),
    # What was put in front of the human: a decision for another input or another
    # version of the capability's policy is refused as stale.
    Column("input_hash", Text, nullable=False),
    Column("policy_version", Integer, nullable=False),
    # The submitting API key's name (None for library submissions): self-approval check.
    Column("requested_by", Text),
    Column("status", Text, nullable=False, server_default=ApprovalStatus.PENDING.value),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("closed_at", DateTime(timezone=True)),
    Column("decision", Text),
    Column("decided_by", Text),
    Column("decision_reason", Text),
    UniqueConstraint("tenant", "tool_call_id", name="uq_approvals_tenant_call"),
    status_check("status", ApprovalStatus, name="ck_approvals_status"),
    CheckConstraint(
        "decision IS NULL OR decision IN ('approve', 'reject')", name="ck_approvals_decision"
    ),
    # A human decision exists exactly when the approval was approved or rejected, and
    # an approval is closed exactly when it is no longer pending.
    CheckConstraint(
        f"(decision IS NOT NULL) = ({_in('status', _DECIDED)})",
        name="ck_approvals_decided",
    ),
    CheckConstraint(
        f"(closed_at IS NULL) = (status = '{ApprovalStatus.PENDING.value}')",
        name="ck_approvals_closed",
    ),
    # The inbox's order, expiring soonest first, with and without a status (migration
    # 0012): a keyset page is a range of one of these.
    Index("ix_approvals_tenant_status", "tenant", "status", "expires_at", "approval_id"),
    Index("ix_approvals_tenant_expiry", "tenant", "expires_at", "approval_id"),
    # The expiry sweeper scans only pending approvals.
    Index(
        "ix_approvals_pending_expiry",
        "expires_at",
        postgresql_where=text(f"status = '{ApprovalStatus.PENDING.value}'"),
    ),
)

runs = Table(
    "runs",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("run_id", Text, primary_key=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Set once by the stop command; a stopped run accepts no new calls (intake locks
    # the row FOR KEY SHARE, the stop FOR UPDATE: see dispatcher.control.runs).
    Column("stopped_at", DateTime(timezone=True)),
    Column("stopped_by", Text),
    Column("reason", Text),
)

# Each run's calls counted by status, kept in the transaction of every move (0013).
run_summaries = run_summaries_table(metadata)
bus_offsets = bus_offsets_table(metadata)
capability_states, capability_events, capability_breakers = capability_tables(metadata)
# Bulk operations (0021), and on tool_calls the index their batches read.
bulk_operations, bulk_operation_calls = bulk_operation_tables(metadata, tool_calls)

console_sessions = console_sessions_table(metadata)
# Webhooks (dispatcher.webhooks, migration 0022): dispatcher.db.webhooks says each.
(webhook_notifications, webhook_deliveries, webhook_subscription_states, webhook_reported) = (
    webhook_tables(metadata)
)

# Retention (dispatcher.retention, migration 0014). The manifest: one row per archive
# batch, a batch of one tenant's calls or a dropped day of events, with the files it
# wrote. Its state moves planned -> written -> verified -> removed (or abandoned, when
# its calls changed before they could be removed), so a run that crashed is resumed.
RETENTION_BATCH_STATES = ("planned", "written", "verified", "removed", "abandoned")
UNFINISHED_BATCH_STATES = RETENTION_BATCH_STATES[:3]
_LISTED_STATES = ", ".join(f"'{s}'" for s in RETENTION_BATCH_STATES)
_UNFINISHED = ", ".join(f"'{s}'" for s in UNFINISHED_BATCH_STATES)

retention_batches = Table(
    "retention_batches",
    metadata,
    # Derived from the batch's content; each of its files is named by it.
    Column("batch_id", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("tenant", Text),
    Column("state", Text, nullable=False),
    # A calls batch: [[toolCallId, version, updatedAt], ...] as planned (cleared once
    # removed); a partition batch: {"partition": name}.
    Column("members", JSONB),
    # [{"path", "table", "tenant", "day", "rows", "sha256"}, ...]: sha256 once verified.
    Column("files", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("kind IN ('calls', 'partition')", name="ck_retention_batches_kind"),
    CheckConstraint(f"state IN ({_LISTED_STATES})", name="ck_retention_batches_state"),
    Index(
        "ix_retention_batches_unfinished",
        "created_at",
        postgresql_where=text(f"state IN ({_UNFINISHED})"),
    ),
)

# The audit of what retention removed, per batch, tenant and day: the only path that
# removes history says what it removed.
retention_log = Table(
    "retention_log",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("batch_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("day", Date, nullable=False),
    Column("calls", Integer, nullable=False, server_default="0"),
    Column("approvals", Integer, nullable=False, server_default="0"),
    Column("escalations", Integer, nullable=False, server_default="0"),
    # Events written to the archive by this batch, and rows of the log dropped with a
    # day's partition.
    Column("events_archived", Integer, nullable=False, server_default="0"),
    Column("events_dropped", Integer, nullable=False, server_default="0"),
    Column("removed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_retention_log_removed_at", "removed_at"),
)
