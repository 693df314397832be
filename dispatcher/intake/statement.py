"""The intake write as one constant SQL statement (see :data:`INTAKE`), the replay's
reads, and the caller's transaction they all go through (:class:`CallerTransaction`).

Kept apart from :mod:`dispatcher.intake.service`, which decides what to write: this module
only says how it is written in one round trip (:func:`write_intake`) and read back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from sqlalchemy import TextualSelect, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from dispatcher.db.jsonb import dumps
from dispatcher.db.sqltext import compact
from dispatcher.db.tables import tool_calls
from dispatcher.ledger.events import PUBLISHED_AS, headers_sql
from dispatcher.schemas import ToolCallView
from dispatcher.states import INITIAL_STATES
from dispatcher.tenancy import ordering_key_sql

_CALL_COLUMNS = (
    "tool_call_id", "tenant", "run_id", "turn_id", "capability_id", "input", "idempotency_key",
    "provider_key", "request_fingerprint", "status", "correlation_id", "causation_id",
    "reasoning_object_id", "traceparent", "tool_name",
)  # fmt: skip
_EVENT_COLUMNS = {
    "event_id": "text", "event_type": "text", "tenant": "text", "run_id": "text",
    "turn_id": "text", "producer": "text", "reasoning_object_id": "text",
    "capability_id": "text", "correlation_id": "text", "causation_id": "text",
    "tool_call_id": "text", "schema_version": "int", "occurred_at": "timestamptz",
    "payload": "jsonb",
}  # fmt: skip
_OUTBOX_COLUMNS = {"topic": "text", "key": "text", "payload": "jsonb", "headers": "jsonb"}
_APPROVAL_COLUMNS = (
    "approval_id", "tool_call_id", "tenant", "run_id", "capability_id", "risk", "input_hash",
    "policy_version", "requested_by", "expires_at",
)  # fmt: skip


def _rows_of(param: str, table: str, columns: tuple[str, ...]) -> str:
    """SELECT list and FROM of the rows of ``table`` passed as one JSON array in
    ``param``; their array order is the ``ordinality`` column (WITH ORDINALITY, an alias
    without a column list). Each column is typed as the table's own (the table's row
    type, NULL where a row has no value), rather than by a column list written out in
    the text: the statement stays under the parse cache's limit (see _INTAKE_SQL)."""
    # Only this module's constant names go into the text.
    rows = f"ROWS FROM (jsonb_populate_recordset(NULL::{table}, :{param}))"
    return f"SELECT {', '.join(columns)} FROM {rows} WITH ORDINALITY AS {param}_in"  # noqa: S608


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


# The created calls' events, each of which is also published. Each arrives as its
# message's payload (dispatcher.ledger.events.envelope), beside the submission's trace
# context: the outbox row takes that payload as it is, and the event row its columns
# (jsonb_to_record), so an event travels once as JSON and no message is built, in
# Python or here (jsonb_build_object cost PostgreSQL a type lookup per argument per
# row). ``occurredAt`` stays the ISO 8601 text the row was planned with, which the
# message carries; ``traceparent`` and ``tracestate`` are a header of each message.
def _q(name: str) -> str:
    """A published (camelCase) name as an SQL identifier."""
    return name if name.islower() else f'"{name}"'


_PUBLISHED = {column: _q(name) for name, column in PUBLISHED_AS.items()}
_EVENT_SPEC = ", ".join(
    f"{_PUBLISHED[c]} {'text' if c == 'occurred_at' else t}" for c, t in _EVENT_COLUMNS.items()
)
# The created calls' events are kept first, by their calls' keys, and read after: in
# one join with the calls, the planner could read every event once per created call.
_EVENTS_IN = f"""events_kept AS MATERIALIZED (
    SELECT * FROM ROWS FROM (jsonb_to_recordset(:events) AS (message jsonb,
        traceparent text, tracestate text, call_tenant text, call text)) WITH ORDINALITY AS e_in
    WHERE (call_tenant, call) IN (SELECT tenant, tool_call_id FROM calls)
), events_in AS MATERIALIZED (
    SELECT * FROM events_kept, jsonb_to_record(message) AS x({_EVENT_SPEC})
)"""  # noqa: S608 - constant column lists
_INSERTED_EVENT = ", ".join(
    f"{_PUBLISHED[c]}::timestamptz" if c == "occurred_at" else _PUBLISHED[c] for c in _EVENT_COLUMNS
)
_EVENT_KEY = ordering_key_sql("e.tenant", f"e.{_PUBLISHED['run_id']}")
_EVENT_HEADERS = (
    headers_sql(
        *(f"e.{_PUBLISHED[c]}" for c in ("event_id", "event_type", "producer", "occurred_at"))
    )
    + " || jsonb_strip_nulls("
    "jsonb_build_object('traceparent', e.traceparent, 'tracestate', e.tracestate))"
)


# The planned messages (the dispatch commands), each with the call it belongs to.
_MESSAGE_SPEC = ", ".join(
    [*(f"{c} {t}" for c, t in _OUTBOX_COLUMNS.items()), "call_tenant text", "call text"]
)


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
_APPROVALS = f"""approvals AS (
    INSERT INTO approvals ({", ".join(_APPROVAL_COLUMNS)})
    {_rows_of("approvals", "approvals", _APPROVAL_COLUMNS)}
    WHERE (tenant, tool_call_id) IN (SELECT tenant, tool_call_id FROM calls) ORDER BY ordinality
), """  # noqa: S608 - constant column lists


# Each created call counted in its run's summary (dispatcher.ledger.summaries): one row
# per run, taken in (tenant, run_id) order as every count takes them, in the transaction
# that creates the calls. A call is created proposed or authorized (INITIAL_STATES).
_CREATED = sorted(s.value for s in INITIAL_STATES)
_COUNTED = f"""summaries AS (
    INSERT INTO run_summaries AS r (tenant, run_id, {", ".join(_CREATED)})
    SELECT tenant, run_id, {", ".join(f"count(*) FILTER (WHERE status='{s}')" for s in _CREATED)}
    FROM calls GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (tenant, run_id) DO UPDATE
    SET {", ".join(f"{s}=r.{s}+excluded.{s}" for s in _CREATED)}, updated_at=now()
)"""  # noqa: S608 - constant text


def _intake(approvals: bool) -> TextualSelect:
    """:data:`INTAKE`, or the same without its approvals' INSERT (``approvals`` false)."""
    statement = text(
        f"""WITH {_STOPPED}, calls AS (
    INSERT INTO tool_calls ({", ".join(_CALL_COLUMNS)})
    {_rows_of("calls", "tool_calls", _CALL_COLUMNS)}
    WHERE NOT EXISTS (
        SELECT 1 FROM stopped s WHERE s.tenant = calls_in.tenant AND s.run_id = calls_in.run_id
    ) ORDER BY ordinality
    ON CONFLICT DO NOTHING RETURNING *
), {_APPROVALS if approvals else ""}{_EVENTS_IN}, events AS (
    INSERT INTO execution_events ({", ".join(_EVENT_COLUMNS)})
    SELECT {_INSERTED_EVENT} FROM events_in ORDER BY ordinality
), messages AS (
    INSERT INTO outbox ({", ".join(_OUTBOX_COLUMNS)})
    SELECT {", ".join(_OUTBOX_COLUMNS)} FROM (
        SELECT 0 AS part, e.ordinality, CAST(:events_topic AS text) AS topic, {_EVENT_KEY} AS key,
            e.message AS payload, {_EVENT_HEADERS} AS headers
        FROM events_in e
        UNION ALL
        SELECT 1, m.ordinality, m.topic, m.key, m.payload, m.headers
        FROM ROWS FROM (jsonb_to_recordset(:messages) AS ({_MESSAGE_SPEC}))
        WITH ORDINALITY AS m
        WHERE (m.call_tenant, m.call) IN (SELECT tenant, tool_call_id FROM calls)
    ) AS published ORDER BY part, ordinality
), {_COUNTED}
SELECT {", ".join(_RETURNED)} FROM calls"""  # noqa: S608 - constant text, every value is a bound parameter
    )
    params = ["calls", "events", "messages", *(["approvals"] if approvals else [])]
    return statement.bindparams(
        *(bindparam(name, type_=JSONB) for name in params), bindparam("events_topic")
    ).columns(*(tool_calls.c[name] for name in _RETURNED))


INTAKE = _intake(approvals=True)
"""The intake write of a batch; a batch without approvals goes without their INSERT,
which is about 4% of PostgreSQL's instructions for a call (callgrind)."""

# Compact on the wire, under psycopg's parse-cache limit of 4,096 characters
# (dispatcher.db.sqltext: the layout makes it 4,175, compact 3,749 with the approvals'
# INSERT and 3,293 without); tests/intake hold it there. The tables' row types type the
# calls' and approvals' JSON (_rows_of): their column lists written out were 400
# characters, the count of the runs' summaries 360.
_INTAKE_SQL = {
    approvals: compact(str(statement.compile(dialect=psycopg_dialect.dialect())))  # type: ignore[no-untyped-call]
    for approvals, statement in ((True, INTAKE), (False, _intake(approvals=False)))
}


def _driver_connection(session: Session) -> Any:
    return session.connection().connection.driver_connection


Transaction = AsyncSession | psycopg.AsyncConnection[Any]
"""The caller's open transaction that intake writes in: a SQLAlchemy ``AsyncSession``
(psycopg 3) or a psycopg ``AsyncConnection``."""


@dataclass(frozen=True, slots=True)
class CallerTransaction:
    """The psycopg connection under the caller's transaction, which every intake
    statement goes through: the same transaction, without SQLAlchemy's execution and
    result layers on the hot path (about a sixth of the CPU per call,
    ``python -m bench.intake``). A session's caller gets errors as SQLAlchemy's, as from
    any other statement of the session; a psycopg caller gets psycopg's."""

    driver: psycopg.AsyncConnection[Any]
    through_sqlalchemy: bool

    @classmethod
    async def of(cls, transaction: Transaction) -> CallerTransaction:
        if isinstance(transaction, AsyncSession):
            # One hop into SQLAlchemy's greenlet rather than two (connection, then raw).
            return cls(await transaction.run_sync(_driver_connection), True)
        if isinstance(transaction, psycopg.AsyncConnection):
            return cls(transaction, False)
        # Before anything is sent: a sync connection would fail in the middle.
        raise TypeError(
            "submit() records in an AsyncSession or a psycopg AsyncConnection, not a "
            f"{type(transaction).__name__}"
        )

    async def rows(
        self, sql: str, params: Mapping[str, Any], *, prepare: bool | None = None
    ) -> list[dict[str, Any]]:
        try:
            async with self.driver.cursor(row_factory=dict_row) as cursor:
                await cursor.execute(sql, params, prepare=prepare)
                return await cursor.fetchall()
        except psycopg.Error as exc:
            if self.through_sqlalchemy:
                raise DBAPIError.instance(sql, None, exc, psycopg.Error) from exc
            raise


def jsonb(value: Any) -> Jsonb:
    """A jsonb parameter encoded by the service's own :func:`dispatcher.db.jsonb.dumps`,
    whatever the caller's connection was configured with."""
    return Jsonb(value, dumps=dumps)


async def write_intake(
    tx: CallerTransaction, rows: dict[str, list[dict[str, Any]]], events_topic: str
) -> list[dict[str, Any]]:
    """Run :data:`INTAKE` in the caller's transaction; the created calls' rows. Their
    events' messages go on ``events_topic``."""
    approvals = bool(rows.get("approvals"))
    params: dict[str, Any] = {
        name: jsonb(value) for name, value in rows.items() if approvals or name != "approvals"
    }
    sql = _INTAKE_SQL[approvals]
    return await tx.rows(sql, {**params, "events_topic": events_topic}, prepare=True)


# What a replay reads: the stored calls by key, the pre-0007 calls by their bare id,
# and the stopped runs (the approvals' read is in dispatcher.intake.approvals).
# Constant texts over a pair of arrays (PAIRS, pairs()), so the batch size never
# changes the statement; each pair is one index lookup.
PAIRS = "unnest(%(tenants)s::text[], %(values)s::text[]) AS k(tenant, value)"
STORED_BY_KEY = (
    f"SELECT c.* FROM {PAIRS} JOIN tool_calls c"  # noqa: S608 - constant text
    " ON c.tenant = k.tenant AND c.idempotency_key = k.value"
)
STORED_BY_BARE_ID = (
    f"SELECT c.* FROM {PAIRS} JOIN tool_calls c"  # noqa: S608 - constant text
    " ON c.tenant = k.tenant AND c.tool_call_id = k.value"
    " WHERE c.idempotency_key = c.tool_call_id"
)
STOPPED_RUNS = (
    f"SELECT r.tenant, r.run_id FROM {PAIRS} JOIN runs r"  # noqa: S608 - constant text
    " ON r.tenant = k.tenant AND r.run_id = k.value WHERE r.stopped_at IS NOT NULL"
)


def pairs(values: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """The parameters of a statement over (tenant, value) pairs."""
    listed = list(values)
    return {"tenants": [t for t, _ in listed], "values": [v for _, v in listed]}
