"""Prometheus metrics of the reconciler (default registry), and the :class:`Tally` a
pass returns.

Outcome and lookup-error counters move as calls are settled; the gauges are read from
the database on a schedule of their own (:func:`refresh`, the ``reconciler_gauges``
loop), so they describe the whole backlog rather than what this one process saw, and
never hold a pass back. Each reads the live set through a partial or status-led index
(the statements below), never the history of finished calls: those are counted as they
finish (``tool_dispatcher_transitions_total``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge
from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import IN_FLIGHT_CALLS, escalations, tool_calls
from dispatcher.states import (
    IN_FLIGHT_STATES,
    EscalationStatus,
    ExecutionStatus,
    ReconciliationStatus,
)

UNKNOWN_BACKLOG = Gauge(
    "tool_dispatcher_reconciler_unknown_backlog",
    "Calls whose outcome the reconciler still has to establish",
)
OLDEST_UNKNOWN_AGE = Gauge(
    "tool_dispatcher_reconciler_oldest_unknown_age_seconds",
    "Seconds since the oldest call still in doubt was dispatched (0 when none)",
)
OUTCOMES = Counter(
    "tool_dispatcher_reconciler_outcomes_total",
    "Looks at calls in doubt, by outcome class",
    ["outcome"],
)
LOOKUP_ERRORS = Counter(
    "tool_dispatcher_reconciler_lookup_errors_total",
    "Provider lookups that got no answer (timeout, connection error, 5xx), by capability",
    ["capability"],
)
OPEN_ESCALATIONS = Gauge(
    "tool_dispatcher_reconciler_open_escalations",
    "Escalations not yet resolved (open or acknowledged)",
)
OLDEST_OPEN_ESCALATION_AGE = Gauge(
    "tool_dispatcher_reconciler_oldest_open_escalation_age_seconds",
    "Seconds since the oldest escalation not yet resolved was opened (0 when none)",
)
CALLS = Gauge(
    "tool_dispatcher_calls",
    "Calls in each in-flight execution status (0 when none); finished calls are counted "
    "by tool_dispatcher_transitions_total",
    ["status"],
)
OLDEST_ACCEPTED_AGE = Gauge(
    "tool_dispatcher_oldest_accepted_age_seconds",
    "Seconds since the oldest call still accepted was accepted (0 when none)",
)

UNRESOLVED = (EscalationStatus.OPEN.value, EscalationStatus.ACKNOWLEDGED.value)
"""Every escalation status but ``resolved``: what the open-escalations gauge counts."""

OUTCOME_CLASSES = (
    "confirmed_success",
    "confirmed_failure",
    "compensated",
    "redispatched",
    "retry_later",
    "escalated",
    "taken_over",
)
"""Outcome classes of one look at a call, as counted and printed."""


@dataclass
class Tally:
    """Calls per outcome class."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, outcome: str, n: int = 1) -> None:
        if n:
            self.counts[outcome] += n
            OUTCOMES.labels(outcome).inc(n)

    def merge(self, other: Tally) -> None:
        self.counts.update(other.counts)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> list[str]:
        """One line per outcome class, zeros included (stable for scripts)."""
        return [f"{outcome}: {self.counts[outcome]}" for outcome in OUTCOME_CLASSES]


def backlog_query() -> Select[Any]:
    """The calls the reconciler still follows up, and the oldest one's age: the rows of
    the partial index ``ix_tool_calls_reconcile_due``."""
    started = func.coalesce(tool_calls.c.dispatched_at, tool_calls.c.created_at)
    return select(func.count(), _age(started)).where(
        tool_calls.c.reconciliation_status == ReconciliationStatus.PENDING.value
    )


def open_escalations_query() -> Select[Any]:
    """The escalations not yet resolved, and the oldest one's age: a range of
    ``ix_escalations_status`` (an IN on the index's first column; ``<> 'resolved'``
    would read every resolved escalation too)."""
    return select(func.count(), _age(escalations.c.created_at)).where(
        escalations.c.status.in_(UNRESOLVED)
    )


def calls_in_flight_query() -> Select[Any]:
    """Calls per in-flight status, and per status the oldest one's age (the accepted
    ones' since they were accepted): the rows of ``ix_tool_calls_in_flight``."""
    return (
        select(
            tool_calls.c.status,
            func.count(),
            _age(func.coalesce(tool_calls.c.accepted_at, tool_calls.c.updated_at)),
        )
        .where(IN_FLIGHT_CALLS)
        .group_by(tool_calls.c.status)
    )


async def refresh(sessions: async_sessionmaker[AsyncSession]) -> None:
    """Set the gauges from the database: three reads of the live set, each through an
    index that holds about what it counts (the statements above)."""
    async with sessions() as session:
        backlog, oldest = (await session.execute(backlog_query())).one()
        open_count, oldest_open = (await session.execute(open_escalations_query())).one()
        by_status = {
            status: (count, float(age))
            for status, count, age in await session.execute(calls_in_flight_query())
        }
    UNKNOWN_BACKLOG.set(backlog)
    OLDEST_UNKNOWN_AGE.set(float(oldest))
    OPEN_ESCALATIONS.set(open_count)
    OLDEST_OPEN_ESCALATION_AGE.set(float(oldest_open))
    for status in IN_FLIGHT_STATES:
        CALLS.labels(status.value).set(by_status.get(status.value, (0, 0.0))[0])
    OLDEST_ACCEPTED_AGE.set(by_status.get(ExecutionStatus.ACCEPTED.value, (0, 0.0))[1])


def _age(at: Any) -> Any:
    """Seconds since the earliest ``at`` (0 when there is none)."""
    return func.coalesce(func.extract("epoch", func.now() - func.min(at)), 0)
