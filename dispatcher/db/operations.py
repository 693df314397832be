"""The bulk operation tables (migration 0021): ``bulk_operations``, one row per operation
an operator submitted (its filter, progress, keyset cursor and lease), and
``bulk_operation_calls``, one row per call an operation touched, written in the
transaction that moved the call: its primary key is what makes an operation touch a
call at most once, however often a batch is retried after a crash."""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
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

from dispatcher.states import ExecutionStatus, OperationState

OUTCOMES = ("done", "refused")
"""A touched call's outcome: moved as asked, or refused by the single-call command (its
problem code says why: the call moved meanwhile, its run was stopped...)."""


OPERABLE_STATES = (ExecutionStatus.ESCALATED, ExecutionStatus.FAILED)
"""The finished-or-stuck calls an operation selects from history (a cancel's queued
calls are the live set, read by ``ix_tool_calls_in_flight``)."""


def bulk_operation_tables(metadata: MetaData, tool_calls: Table) -> tuple[Table, Table]:
    """The two tables, and on ``tool_calls`` the index a batch reads: the failed and
    escalated calls by tenant, status, last change and id, the order a batch works in,
    so that a batch is a keyset range of it however many finished calls lie around."""
    listed = ", ".join(f"'{s.value}'" for s in OPERABLE_STATES)
    Index(
        "ix_tool_calls_operable",
        tool_calls.c.tenant,
        tool_calls.c.status,
        tool_calls.c.updated_at,
        tool_calls.c.tool_call_id,
        postgresql_where=text(f"status IN ({listed})"),
    )
    return bulk_operations_table(metadata), bulk_operation_calls_table(metadata)


def bulk_operations_table(metadata: MetaData) -> Table:
    states = ", ".join(f"'{s.value}'" for s in OperationState)
    return Table(
        "bulk_operations",
        metadata,
        Column("operation_id", Text, nullable=False),
        # The submitter's tenant: who may read and cancel it (and every admin).
        Column("tenant", Text, nullable=False),
        Column("kind", Text, nullable=False),
        # The filter as submitted (camelCase JSON); its tenant may be every tenant's.
        Column("filter", JSONB, nullable=False),
        # What the single-call command is given for each call (reason, finding...).
        Column("params", JSONB, nullable=False),
        Column("actor", JSONB, nullable=False),
        # A client's key for the submission: the same key again returns this row.
        Column("idempotency_key", Text),
        Column("state", Text, nullable=False, server_default=OperationState.RUNNING.value),
        Column("total", Integer, nullable=False),
        Column("done", Integer, nullable=False, server_default="0"),
        Column("failed", Integer, nullable=False, server_default="0"),
        # The last call a committed batch selected (its sort key), null before the first.
        Column("cursor", JSONB),
        Column("lease_owner", Text),
        Column("lease_expires_at", DateTime(timezone=True)),
        Column("cancelled_by", JSONB),
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("finished_at", DateTime(timezone=True)),
        PrimaryKeyConstraint("operation_id", name="bulk_operations_pkey"),
        UniqueConstraint("tenant", "idempotency_key", name="uq_bulk_operations_tenant_key"),
        CheckConstraint(f"state IN ({states})", name="ck_bulk_operations_state"),
        # The processors' claim reads only the running operations.
        Index(
            "ix_bulk_operations_running",
            "lease_expires_at",
            postgresql_where=text(f"state = '{OperationState.RUNNING.value}'"),
        ),
    )


def bulk_operation_calls_table(metadata: MetaData) -> Table:
    outcomes = ", ".join(f"'{o}'" for o in OUTCOMES)
    return Table(
        "bulk_operation_calls",
        metadata,
        Column("operation_id", Text, nullable=False),
        Column("tenant", Text, nullable=False),
        Column("tool_call_id", Text, nullable=False),
        Column("outcome", Text, nullable=False),
        # The refusal's problem code and detail; the event the move recorded.
        Column("code", Text),
        Column("detail", Text),
        Column("event_id", Text),
        Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        PrimaryKeyConstraint(
            "operation_id", "tenant", "tool_call_id", name="bulk_operation_calls_pkey"
        ),
        CheckConstraint(f"outcome IN ({outcomes})", name="ck_bulk_operation_calls_outcome"),
    )
