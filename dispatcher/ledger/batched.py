"""A batch's events and their messages, in one statement.

The events travel as ONE JSON parameter, each event once; the statement inserts them
and the outbox row of each one published (all but those of
:data:`dispatcher.ledger.events.LOG_ONLY`). Each event travels as its message's
payload (:func:`dispatcher.ledger.events.envelope`), which the outbox row takes as it
is, and the event row takes its columns from it. Its text does not change with the
batch size: SQLAlchemy compiles it once and psycopg prepares it once. One execution
(and one firing of the outbox's statement trigger) for the batch, where an
executemany is one per row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import execution_events
from dispatcher.ledger.events import (
    PUBLISHED_AS,
    envelope,
    headers_sql,
    is_published,
    published_sql,
)
from dispatcher.settings import Topics
from dispatcher.tenancy import ordering_key_sql

EVENT_COLUMNS = [c.name for c in execution_events.c if c.name != "seq"]
MESSAGE_COLUMNS = ["topic", "key", "payload", "headers"]


def _spec() -> str:
    """The events' record type, by their published names (:data:`PUBLISHED_AS`);
    ``occurredAt`` stays text: the messages carry the very ISO 8601 text the event row
    was built with."""
    dialect = PGDialect_psycopg()  # type: ignore[no-untyped-call]
    types = {n: execution_events.c[n].type.compile(dialect=dialect) for n in EVENT_COLUMNS}
    return ", ".join(
        f'"{name}" {"text" if column == "occurred_at" else types[column]}'
        for name, column in PUBLISHED_AS.items()
    )


_LISTED = ", ".join(EVENT_COLUMNS)
_INSERTED = ", ".join(
    "e.occurred_at::timestamptz" if n == "occurred_at" else f"e.{n}" for n in EVENT_COLUMNS
)
_HEADERS = headers_sql("e.event_id", "e.event_type", "e.producer", "e.occurred_at")
_KEY = ordering_key_sql("e.tenant", "e.run_id")
# Each event arrives as its message's payload (envelope()): the outbox row takes that
# jsonb as it is, and the event row its columns. Building the payload here with
# jsonb_build_object cost PostgreSQL about 20 µs an event (a type lookup per argument
# per row), more than the rest of the statement.
_COLUMNS_OF_MESSAGE = ", ".join(f'x."{n}" AS {c}' for n, c in PUBLISHED_AS.items())
_EVENTS_IN = (
    f" SELECT {_COLUMNS_OF_MESSAGE}, a.msg, a.ord"  # noqa: S608 (constant column lists)
    " FROM jsonb_array_elements(:events) WITH ORDINALITY AS a(msg, ord),"
    f" jsonb_to_record(a.msg) AS x({_spec()})"
)
_INSERT_EVENTS_AND_MESSAGES = text(
    f"WITH e AS MATERIALIZED ({_EVENTS_IN}),"  # noqa: S608 (constant column lists)
    f" inserted AS (INSERT INTO execution_events ({_LISTED})"
    f" SELECT {_INSERTED} FROM e ORDER BY ord)"
    f" INSERT INTO outbox ({', '.join(MESSAGE_COLUMNS)})"
    f" SELECT :topic, {_KEY}, e.msg, {_HEADERS} FROM e"
    # The log-only types are constants of the text: it stays one text, prepared once.
    f" WHERE {published_sql('e')} ORDER BY e.ord"
).bindparams(bindparam("events", type_=JSONB))
# A batch of log-only events only (a batch claim's): the log's INSERT alone. An INSERT
# into the outbox of no row would still fire the outbox's statement trigger, whose
# NOTIFY wakes every relay at commit to find nothing new.
_INSERT_EVENTS = text(
    f"INSERT INTO execution_events ({_LISTED})"  # noqa: S608 (constant column lists)
    f" SELECT {_INSERTED} FROM ({_EVENTS_IN}) AS e ORDER BY ord"
).bindparams(bindparam("events", type_=JSONB))


async def record_all(
    session: AsyncSession, events: Sequence[Mapping[str, Any]], topics: Topics
) -> None:
    """:func:`dispatcher.ledger.events.record_events` for a batch, in one statement: the
    events and their messages, or the events alone when none is published."""
    if not events:
        return
    rows = [envelope(e) for e in events]
    if any(is_published(e["event_type"]) for e in events):
        await session.execute(_INSERT_EVENTS_AND_MESSAGES, {"events": rows, "topic": topics.events})
    else:
        await session.execute(_INSERT_EVENTS, {"events": rows})
