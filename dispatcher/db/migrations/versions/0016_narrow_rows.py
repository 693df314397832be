"""narrow rows: event types and producers as enum labels, shorter call keys

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05

Every finished call keeps about four events and one call row; after migration 0015 most
of their bytes are rows, not indexes (``python -m bench.growth``, bench/README.md).
Three columns repeat what a few bytes can say:

- ``execution_events.event_type`` and ``execution_events.producer`` hold one of a few
  fixed strings (``tool.call.dispatching``, ``tool-dispatcher.worker``: 21 and 23 bytes)
  on every event. They become enum types, 4 bytes each, read and written as the same
  text: every reader and every published message sees what it saw. A new event type or
  producer needs its label added here first (``ALTER TYPE ... ADD VALUE``, in a later
  migration); ``tests/ledger/test_narrow_rows.py`` fails until it is.
  Assignment casts from text let a statement that types these columns as text (the
  release before this one, still running while this migrates) keep writing them.
- ``tool_calls.request_fingerprint``: a SHA-256 as 64 hex digits becomes its 32 bytes.
  A value that is not 64 hex digits (none is written by the service) keeps its text
  as bytes, and so does one written as text by the release before this one after the
  migration: replays compare either form (``dispatcher.intake.keys.same_request``).
- ``tool_calls.provider_key`` may be NULL: the tenant's namespaced form of the call's
  own idempotency key (``dispatcher.tenancy.provider_key``), which a call whose
  capability namespaces keys no longer stores twice. Calls written before keep the key
  they stored; a stored key always wins (``dispatcher.tenancy.stored_provider_key``).

Each ALTER rewrites its table under its lock (docs/operations.md says how long).
Downgrade writes the text back: the NULL provider keys as their namespaced form.
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# The labels as they stood at this revision (frozen: a later one adds, never removes).
_EVENT_TYPES = (
    "tool.call.requested", "tool.call.authorized", "tool.call.dispatching",
    "tool.call.accepted", "tool.call.completed", "tool.call.failed",
    "tool.call.result_unknown", "tool.call.confirmed", "tool.call.compensated",
    "tool.call.escalated", "tool.call.rejected", "tool.call.cancelled",
    "tool.call.redispatched", "tool.call.reconcile_attempted",
    "tool.call.compensation_requested", "tool.call.escalation_acknowledged",
    "tool.call.redriven", "tool.call.retried", "approval.required", "approval.granted",
    "approval.rejected", "approval.expired", "run.stopped",
)  # fmt: skip
_PRODUCERS = (
    "tool-dispatcher.intake", "tool-dispatcher.approvals", "tool-dispatcher.worker",
    "tool-dispatcher.recovery", "tool-dispatcher.redrive", "tool-dispatcher.reconciler",
    "tool-dispatcher.operator",
)  # fmt: skip
_LABELS = (("execution_event_type", _EVENT_TYPES), ("execution_event_producer", _PRODUCERS))
_HEX = "request_fingerprint ~ '^[0-9a-f]{64}$'"
# migration 0009's rule (dispatcher.tenancy.provider_key), frozen here for downgrade:
# the tenant percent-encoded but for printable ASCII other than "/", "%" and ":".
_NAMESPACED = """
CREATE FUNCTION pg_temp.provider_key(tenant text, key text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT string_agg(
        CASE WHEN b BETWEEN 33 AND 126 AND b NOT IN (37, 47, 58) THEN chr(b)
             ELSE '%' || upper(lpad(to_hex(b), 2, '0')) END, '' ORDER BY i)
        || ':' || key
    FROM (SELECT get_byte(convert_to(tenant, 'UTF8'), i - 1) AS b, i
          FROM generate_series(1, octet_length(convert_to(tenant, 'UTF8'))) AS i) AS t
$$"""


def upgrade() -> None:
    for kind, labels in _LABELS:
        listed = ", ".join(f"'{label}'" for label in labels)
        op.execute(f"CREATE TYPE {kind} AS ENUM ({listed})")
        op.execute(f"CREATE CAST (text AS {kind}) WITH INOUT AS ASSIGNMENT")
    op.execute(
        "ALTER TABLE execution_events"
        " ALTER COLUMN event_type TYPE execution_event_type"
        " USING event_type::execution_event_type,"
        " ALTER COLUMN producer TYPE execution_event_producer"
        " USING producer::execution_event_producer"
    )
    op.execute(
        "ALTER TABLE tool_calls ALTER COLUMN request_fingerprint TYPE bytea USING CASE"
        f" WHEN {_HEX} THEN decode(request_fingerprint, 'hex')"
        " ELSE convert_to(request_fingerprint, 'UTF8') END,"
        " ALTER COLUMN provider_key DROP NOT NULL"
    )


def downgrade() -> None:
    op.execute(_NAMESPACED)
    op.execute(
        "UPDATE tool_calls SET provider_key = pg_temp.provider_key(tenant, idempotency_key)"
        " WHERE provider_key IS NULL"
    )
    op.execute(
        "ALTER TABLE tool_calls ALTER COLUMN provider_key SET NOT NULL,"
        " ALTER COLUMN request_fingerprint TYPE text USING CASE"
        " WHEN octet_length(request_fingerprint) = 32 THEN encode(request_fingerprint, 'hex')"
        " ELSE convert_from(request_fingerprint, 'UTF8') END"
    )
    op.execute(
        "ALTER TABLE execution_events ALTER COLUMN event_type TYPE text,"
        " ALTER COLUMN producer TYPE text"
    )
    for kind, _labels in _LABELS:
        op.execute(f"DROP CAST (text AS {kind})")
        op.execute(f"DROP TYPE {kind}")
