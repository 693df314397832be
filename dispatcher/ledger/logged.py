"""The events of a log-only move, written by the move's own statement.

A claim (``authorized -> dispatching``) records one ``tool.call.dispatching`` event per
call, which is never published (:data:`dispatcher.ledger.events.LOG_ONLY`). Built in
Python, each event was a dict, its published form and its JSON, then parsed back by a
second statement: about 7 µs of the worker's CPU a call, and a round trip a batch. Here
the UPDATE's RETURNING gives each moved row its event id and time, and a data-modifying
CTE of the same statement inserts the events from the moved rows, their payload built
from the row in SQL. Python gets the same values back, for the transition lines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    ColumnElement,
    Integer,
    Text,
    bindparam,
    func,
    insert,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Row, RowMapping
from sqlalchemy.sql.selectable import CTE

from dispatcher.db.tables import execution_events
from dispatcher.ledger.batched import EVENT_COLUMNS
from dispatcher.ledger.events import SCHEMA_VERSION, EventType, is_published
from dispatcher.ledger.messages import Producer
from dispatcher.states import ExecutionStatus

if TYPE_CHECKING:
    from dispatcher.ledger.transitions import BulkMove

PayloadSql = Callable[[CTE], Mapping[str, ColumnElement[Any]]]
"""What a move adds to each event's payload, as SQL over the moved rows (a CTE of the
UPDATE's RETURNING): ``{"claimVersion": moved.c.version, ...}``."""


@dataclass(frozen=True, slots=True)
class Logged:
    """The events of one log-only move: their type, producer and cause, the statuses
    the calls leave and the one they reach, and the payload's per-row part in SQL."""

    event_type: EventType
    producer: Producer
    came_from: Sequence[str]
    to: str
    payload_sql: PayloadSql
    causation_id: str | None = None

    RETURNED: ClassVar[list[ColumnElement[Any]]] = [
        # The format of dispatcher.ledger.events.new_event_id: evt_ and 32 hex digits.
        literal_column("'evt_' || replace(gen_random_uuid()::text, '-', '')", Text).label(
            "event_id"
        ),
        func.clock_timestamp().label("occurred_at"),
    ]
    """What the UPDATE returns besides each row, for its event: its id and its time."""

    def __post_init__(self) -> None:
        if is_published(self.event_type.value):
            # A published event needs its outbox row: this writes the log only.
            raise ValueError(f"{self.event_type.value} is published, not log-only")

    @classmethod
    def of(
        cls,
        moves: Sequence[BulkMove],
        event_type: EventType,
        producer: Producer,
        came_from: Sequence[str],
        target: ExecutionStatus,
        payload_sql: PayloadSql,
        causation_id: str | None,
    ) -> Logged:
        """The events of moving ``moves`` to ``target``, which carry no payload of their
        own: a move's payload would be lost in SQL, so it is refused before any statement
        is sent."""
        if any(m.payload for m in moves):
            raise ValueError("events written in SQL take no payload from their moves")
        return cls(event_type, producer, came_from, target.value, payload_sql, causation_id)

    def inserted(self, moved: CTE) -> CTE:
        """The INSERT of the moved rows' events, as a CTE of the moving statement."""
        pairs: list[Any] = [
            _const("from"),
            func.jsonb_build_array(*(_const(s) for s in self.came_from)),
            _const("to"),
            _const(self.to),
        ]
        for key, value in self.payload_sql(moved).items():
            pairs += [_const(key), value]
        values: dict[str, Any] = {
            "event_id": moved.c.event_id,
            "event_type": _const(self.event_type.value),
            "producer": _const(self.producer.value),
            "causation_id": bindparam("logged_causation", self.causation_id, type_=Text),
            "schema_version": literal_column(str(SCHEMA_VERSION), Integer),
            "occurred_at": moved.c.occurred_at,
            "payload": func.jsonb_build_object(*pairs, type_=JSONB),
        }
        columns = [values[c] if c in values else moved.c[c] for c in EVENT_COLUMNS]
        rows = select(*columns).order_by(moved.c.tenant, moved.c.tool_call_id)
        return insert(execution_events).from_select(EVENT_COLUMNS, rows).cte("logged")

    def event(
        self, row: Row[Any], row_payload: Callable[[RowMapping], Mapping[str, Any]] | None
    ) -> dict[str, Any]:
        """The event the statement wrote for ``row``, as
        :func:`dispatcher.ledger.events.event_row` builds one; ``row_payload`` gives its
        per-row part as Python sees it (the payload's SQL twin)."""
        payload = row_payload(row._mapping) if row_payload else {}
        return {
            "event_id": row.event_id,
            "event_type": self.event_type.value,
            "tenant": row.tenant,
            "run_id": row.run_id,
            "turn_id": row.turn_id,
            "producer": self.producer.value,
            "reasoning_object_id": row.reasoning_object_id,
            "capability_id": row.capability_id,
            "correlation_id": row.correlation_id,
            "causation_id": self.causation_id,
            "tool_call_id": row.tool_call_id,
            "schema_version": SCHEMA_VERSION,
            "occurred_at": row.occurred_at,
            "payload": {"from": list(self.came_from), "to": self.to, **payload},
        }


def _const(value: str) -> ColumnElement[Any]:
    """One of this service's own names (a status, an event type, a payload key) as a
    text constant: typed for jsonb_build_object, and the statement's text stays one."""
    if "'" in value:
        raise ValueError(f"not a constant name: {value!r}")
    return literal_column(f"'{value}'", Text)
