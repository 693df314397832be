"""The intake write as one constant SQL statement (see :data:`INTAKE`).

Kept apart from :mod:`dispatcher.intake`, which decides what to write: this module
only says how it is written in one round trip.
"""

from __future__ import annotations

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from dispatcher.tables import tool_calls

_CALL_COLUMNS = {
    "tool_call_id": "text", "tenant": "text", "run_id": "text", "turn_id": "text",
    "capability_id": "text", "input": "jsonb", "idempotency_key": "text",
    "request_fingerprint": "text", "status": "text", "correlation_id": "text",
    "causation_id": "text", "reasoning_object_id": "text",
}  # fmt: skip
_EVENT_COLUMNS = {
    "event_id": "text", "event_type": "text", "tenant": "text", "run_id": "text",
    "turn_id": "text", "producer": "text", "reasoning_object_id": "text",
    "capability_id": "text", "correlation_id": "text", "causation_id": "text",
    "tool_call_id": "text", "schema_version": "int", "occurred_at": "timestamptz",
    "payload": "jsonb",
}  # fmt: skip
_OUTBOX_COLUMNS = {"topic": "text", "key": "text", "payload": "jsonb", "headers": "jsonb"}
_APPROVAL_COLUMNS = {
    "approval_id": "text", "tool_call_id": "text", "tenant": "text", "run_id": "text",
    "capability_id": "text", "risk": "text", "input_hash": "text", "policy_version": "int",
    "requested_by": "text", "expires_at": "timestamptz",
}  # fmt: skip


def _rows_of(param: str, columns: dict[str, str], extra: str = "") -> str:
    """SELECT list and FROM of the rows passed as one JSON array in ``param``, in
    array order (WITH ORDINALITY)."""
    spec = ", ".join(f"{c} {t}" for c, t in columns.items()) + (f", {extra} text" if extra else "")
    names = ", ".join(columns) + (f", {extra}" if extra else "")
    # Only this module's constant column lists go into the text.
    rows = f"ROWS FROM (jsonb_to_recordset(:{param}) AS ({spec}))"
    return f"SELECT {', '.join(columns)} FROM {rows} WITH ORDINALITY AS {param}_in({names}, ord)"  # noqa: S608


# The run guard, racing the stop command (dispatcher.runs.stop_run), which first locks
# the run's row FOR UPDATE, then sets stopped_at, then cancels the run's queued calls
# in a later statement. Intake locks every run of the batch FOR KEY SHARE (intakes do
# not block each other), so exactly one of two orders happens:
# - intake first: the stop waits for intake's commit, and its cancelling statement,
#   which starts after that, sees and cancels the new calls;
# - stop first: intake's lock waits for the stop's commit and then returns the row's
#   newest version (READ COMMITTED re-reads a row it had to wait for), stopped.
# A row this statement's snapshot cannot see (a run created or stopped concurrently)
# is handled by the INSERT: ON CONFLICT DO UPDATE waits for the other transaction and
# then sees (and locks) the newest version even though the snapshot does not; its
# WHERE only rewrites a stopped row, whose RETURNING then names the run as stopped.
_RUN_GUARD = """wanted AS MATERIALIZED (
    SELECT DISTINCT tenant, run_id FROM jsonb_to_recordset(:calls) AS w(tenant text, run_id text)
), known AS MATERIALIZED (
    SELECT r.tenant, r.run_id, r.stopped_at FROM runs r
    JOIN wanted w ON r.tenant = w.tenant AND r.run_id = w.run_id
    ORDER BY r.tenant, r.run_id
    FOR KEY SHARE OF r
), created AS (
    INSERT INTO runs (tenant, run_id)
    SELECT tenant, run_id FROM wanted w WHERE NOT EXISTS (
        SELECT 1 FROM known k WHERE k.tenant = w.tenant AND k.run_id = w.run_id
    ) ORDER BY tenant, run_id
    ON CONFLICT (tenant, run_id) DO UPDATE SET stopped_at = runs.stopped_at
    WHERE runs.stopped_at IS NOT NULL
    RETURNING tenant, run_id, stopped_at
), stopped AS (
    SELECT tenant, run_id FROM known WHERE stopped_at IS NOT NULL
    UNION ALL SELECT tenant, run_id FROM created WHERE stopped_at IS NOT NULL
)"""


# The whole intake write in one statement and one round trip. Events and outbox rows
# are written only for the calls the first INSERT created (its RETURNING), so a
# replayed or refused item adds nothing. The text is constant: SQLAlchemy compiles it
# once and psycopg prepares it once, whatever the batch size (a ``.values(list)``
# statement is compiled anew on every call, which cost more CPU than all the rest).
# No conflict target: a clash on the key or on the toolCallId both skip the row. A
# concurrent uncommitted insert of the same key makes PostgreSQL wait for it, so the
# SELECT in _replay sees the winner.
INTAKE = (
    text(
        f"""WITH {_RUN_GUARD}, calls AS (
    INSERT INTO tool_calls ({", ".join(_CALL_COLUMNS)})
    {_rows_of("calls", _CALL_COLUMNS)}
    WHERE NOT EXISTS (
        SELECT 1 FROM stopped s WHERE s.tenant = calls_in.tenant AND s.run_id = calls_in.run_id
    ) ORDER BY ord
    ON CONFLICT DO NOTHING RETURNING *
), approvals AS (
    INSERT INTO approvals ({", ".join(_APPROVAL_COLUMNS)})
    {_rows_of("approvals", _APPROVAL_COLUMNS)}
    WHERE tool_call_id IN (SELECT tool_call_id FROM calls) ORDER BY ord
), events AS (
    INSERT INTO execution_events ({", ".join(_EVENT_COLUMNS)})
    {_rows_of("events", _EVENT_COLUMNS)}
    WHERE tool_call_id IN (SELECT tool_call_id FROM calls) ORDER BY ord
), messages AS (
    INSERT INTO outbox ({", ".join(_OUTBOX_COLUMNS)})
    {_rows_of("messages", _OUTBOX_COLUMNS, extra="call")}
    WHERE call IN (SELECT tool_call_id FROM calls) ORDER BY ord
)
SELECT * FROM calls"""  # noqa: S608 - constant text, every value is a bound parameter
    )
    .bindparams(
        bindparam("calls", type_=JSONB),
        bindparam("events", type_=JSONB),
        bindparam("messages", type_=JSONB),
        bindparam("approvals", type_=JSONB),
    )
    .columns(*tool_calls.c)
)
