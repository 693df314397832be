"""A batch's events and their messages, in one statement.

The events travel as ONE JSON parameter, each event once; the statement inserts them
and builds the outbox row of each one published (all but those of
:data:`dispatcher.ledger.events.LOG_ONLY`) from the row it inserted
(:func:`envelope_sql`), so neither the messages nor their JSON are built in Python. Its
text does not change with the batch size: SQLAlchemy compiles it once and psycopg
prepares it once. One execution (and one firing of the outbox's statement trigger) for
the batch, where an executemany is one per row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import execution_events
from dispatcher.ledger.events import envelope_sql, is_published, published_sql
from dispatcher.settings import Topics
from dispatcher.tenancy import ordering_key_sql

EVENT_COLUMNS = [c.name for c in execution_events.c if c.name != "seq"]
MESSAGE_COLUMNS = ["topic", "key", "payload", "headers"]


def _spec() -> str:
    """The events' record type; ``occurred_at`` stays text: the messages carry the
    very ISO 8601 text the event row was built with."""
    dialect = PGDialect_psycopg()  # type: ignore[no-untyped-call]
    types = {n: execution_events.c[n].type.compile(dialect=dialect) for n in EVENT_COLUMNS}
    return ", ".join(f"{n} {'text' if n == 'occurred_at' else types[n]}" for n in EVENT_COLUMNS)


_LISTED = ", ".join(EVENT_COLUMNS)
_INSERTED = ", ".join(
    "e.occurred_at::timestamptz" if n == "occurred_at" else f"e.{n}" for n in EVENT_COLUMNS
)
_PAYLOAD, _HEADERS = envelope_sql("e", "e.occurred_at")
_KEY = ordering_key_sql("e.tenant", "e.run_id")
_EVENTS_IN = (
    f" FROM ROWS FROM (jsonb_to_recordset(:events) AS ({_spec()}))"
    f" WITH ORDINALITY AS e_in({_LISTED}, ord)"
)
_INSERT_EVENTS_AND_MESSAGES = text(
    f"WITH e AS MATERIALIZED (SELECT {_LISTED}, ord{_EVENTS_IN}),"  # noqa: S608 (constant column lists)
    f" inserted AS (INSERT INTO execution_events ({_LISTED})"
    f" SELECT {_INSERTED} FROM e ORDER BY ord)"
    f" INSERT INTO outbox ({', '.join(MESSAGE_COLUMNS)})"
    f" SELECT :topic, {_KEY}, {_PAYLOAD}, {_HEADERS} FROM e"
    # The log-only types are constants of the text: it stays one text, prepared once.
    f" WHERE {published_sql('e')} ORDER BY e.ord"
).bindparams(bindparam("events", type_=JSONB))
# A batch of log-only events only (a batch claim's): the log's INSERT alone. An INSERT
# into the outbox of no row would still fire the outbox's statement trigger, whose
# NOTIFY wakes every relay at commit to find nothing new.
_INSERT_EVENTS = text(
    f"INSERT INTO execution_events ({_LISTED})"  # noqa: S608 (constant column lists)
    f" SELECT {_INSERTED} FROM (SELECT {_LISTED}, ord{_EVENTS_IN}) AS e ORDER BY ord"
).bindparams(bindparam("events", type_=JSONB))


def as_json(event: Mapping[str, Any]) -> dict[str, Any]:
    """An event row as a JSON parameter: its time as ISO 8601 text."""
    return {**event, "occurred_at": event["occurred_at"].isoformat()}


async def record_all(
    session: AsyncSession, events: Sequence[Mapping[str, Any]], topics: Topics
) -> None:
    """:func:`dispatcher.ledger.events.record_events` for a batch, in one statement: the
    events and their messages, or the events alone when none is published."""
    if not events:
        return
    rows = [as_json(e) for e in events]
    if any(is_published(e["event_type"]) for e in events):
        await session.execute(_INSERT_EVENTS_AND_MESSAGES, {"events": rows, "topic": topics.events})
    else:
        await session.execute(_INSERT_EVENTS, {"events": rows})
