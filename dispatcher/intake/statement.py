"""The intake write as one constant SQL statement (see :data:`INTAKE`).

Kept apart from :mod:`dispatcher.intake.service`, which decides what to write: this module
only says how it is written in one round trip (:func:`write_intake`).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from dispatcher.db.tables import tool_calls
from dispatcher.schemas import ToolCallView

_CALL_COLUMNS = {
    "tool_call_id": "text", "tenant": "text", "run_id": "text", "turn_id": "text",
    "capability_id": "text", "input": "jsonb", "idempotency_key": "text",
    "request_fingerprint": "text", "status": "text", "correlation_id": "text",
    "causation_id": "text", "reasoning_object_id": "text", "traceparent": "text",
    "tool_name": "text",
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


def _rows_of(param: str, columns: dict[str, str], extra: tuple[str, ...] = ()) -> str:
    """SELECT list and FROM of the rows passed as one JSON array in ``param``, in
    array order (WITH ORDINALITY); ``extra`` text fields are read but not selected."""
    spec = ", ".join([*(f"{c} {t}" for c, t in columns.items()), *(f"{e} text" for e in extra)])
    names = ", ".join([*columns, *extra])
    # Only this module's constant column lists go into the text.
    rows = f"ROWS FROM (jsonb_to_recordset(:{param}) AS ({spec}))"
    return f"SELECT {', '.join(columns)} FROM {rows} WITH ORDINALITY AS {param}_in({names}, ord)"  # noqa: S608


# The run guard, racing the stop command (dispatcher.control.runs.stop_run), which holds the
# run's advisory lock exclusive while it sets stopped_at and then cancels the run's
# queued calls. stopped_runs_locked (migration 0005) takes the lock shared (intakes do
# not block each other) and then reads the runs with a snapshot of its own, newer than
# this statement's, so exactly one of two orders happens:
# - intake first: the stop waits for intake's commit, and its cancelling statement,
#   which starts after that, sees and cancels the new calls;
# - stop first: the lock waits for the stop's commit, and the read sees the run stopped.
# MATERIALIZED and referenced before any row is inserted: the function runs, and its
# locks are held, before the first call is written.
_STOPPED = """stopped AS MATERIALIZED (
    SELECT tenant, run_id FROM stopped_runs_locked(:calls)
)"""


# What the caller gets back of each created call: its view and its tenant (with the
# toolCallId, the call's key), not every column (each column returned costs CPU in the
# driver on every call).
_RETURNED = (*ToolCallView.row_fields(), "tenant")

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
        f"""WITH {_STOPPED}, calls AS (
    INSERT INTO tool_calls ({", ".join(_CALL_COLUMNS)})
    {_rows_of("calls", _CALL_COLUMNS)}
    WHERE NOT EXISTS (
        SELECT 1 FROM stopped s WHERE s.tenant = calls_in.tenant AND s.run_id = calls_in.run_id
    ) ORDER BY ord
    ON CONFLICT DO NOTHING RETURNING *
), approvals AS (
    INSERT INTO approvals ({", ".join(_APPROVAL_COLUMNS)})
    {_rows_of("approvals", _APPROVAL_COLUMNS)}
    WHERE (tenant, tool_call_id) IN (SELECT tenant, tool_call_id FROM calls) ORDER BY ord
), events AS (
    INSERT INTO execution_events ({", ".join(_EVENT_COLUMNS)})
    {_rows_of("events", _EVENT_COLUMNS)}
    WHERE (tenant, tool_call_id) IN (SELECT tenant, tool_call_id FROM calls) ORDER BY ord
), messages AS (
    INSERT INTO outbox ({", ".join(_OUTBOX_COLUMNS)})
    {_rows_of("messages", _OUTBOX_COLUMNS, extra=("call_tenant", "call"))}
    WHERE (call_tenant, call) IN (SELECT tenant, tool_call_id FROM calls) ORDER BY ord
)
SELECT {", ".join(_RETURNED)} FROM calls"""  # noqa: S608 - constant text, every value is a bound parameter
    )
    .bindparams(
        bindparam("calls", type_=JSONB),
        bindparam("events", type_=JSONB),
        bindparam("messages", type_=JSONB),
        bindparam("approvals", type_=JSONB),
    )
    .columns(*(tool_calls.c[name] for name in _RETURNED))
)

_INTAKE_SQL = str(INTAKE.compile(dialect=psycopg_dialect.dialect()))  # type: ignore[no-untyped-call]


def _driver_connection(session: Session) -> Any:
    return session.connection().connection.driver_connection


async def write_intake(
    session: AsyncSession, rows: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Run :data:`INTAKE` in the session's transaction; the created calls' rows.

    Sent through the session's own psycopg connection rather than SQLAlchemy's
    execution and result layers: the same statement and transaction for about a sixth
    less CPU per call on the intake hot path (``python -m bench.intake``). Errors are
    raised as SQLAlchemy's, as from any other statement of the session."""
    # One hop into SQLAlchemy's greenlet rather than two (connection, then raw).
    driver: psycopg.AsyncConnection[Any] = await session.run_sync(_driver_connection)
    try:
        async with driver.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(
                _INTAKE_SQL, {name: Jsonb(value) for name, value in rows.items()}, prepare=True
            )
            return await cursor.fetchall()
    except psycopg.Error as exc:
        raise DBAPIError.instance(_INTAKE_SQL, None, exc, psycopg.Error) from exc
