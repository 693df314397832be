"""Prometheus metrics of the reconciler (default registry), and the :class:`Tally` a
pass returns.

Outcome and lookup-error counters move as calls are settled; the gauges are read from
the database after every pass, so they describe the whole backlog rather than what
this one process saw.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import escalations, tool_calls
from dispatcher.states import EscalationStatus, ExecutionStatus, ReconciliationStatus

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
    "Calls in each execution status (every status, 0 when none)",
    ["status"],
)
OLDEST_ACCEPTED_AGE = Gauge(
    "tool_dispatcher_oldest_accepted_age_seconds",
    "Seconds since the oldest call still accepted was accepted (0 when none)",
)

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


async def refresh(sessions: async_sessionmaker[AsyncSession]) -> None:
    """Set the gauges from the database: two index-backed aggregates, one count of the
    open escalations, and the calls per status (a scan of ``tool_calls``, once per
    pass: there is no index on the status of every call)."""
    started = func.coalesce(tool_calls.c.dispatched_at, tool_calls.c.created_at)
    async with sessions() as session:
        backlog, oldest = (
            await session.execute(
                select(
                    func.count(),
                    func.coalesce(func.extract("epoch", func.now() - func.min(started)), 0),
                ).where(tool_calls.c.reconciliation_status == ReconciliationStatus.PENDING.value)
            )
        ).one()
        open_count, oldest_open = (
            await session.execute(
                select(func.count(), _age(escalations.c.created_at)).where(
                    escalations.c.status != EscalationStatus.RESOLVED.value
                )
            )
        ).one()
        by_status = {
            status: (count, float(age))
            for status, count, age in await session.execute(
                select(
                    tool_calls.c.status,
                    func.count(),
                    _age(func.coalesce(tool_calls.c.accepted_at, tool_calls.c.updated_at)),
                ).group_by(tool_calls.c.status)
            )
        }
    UNKNOWN_BACKLOG.set(backlog)
    OLDEST_UNKNOWN_AGE.set(float(oldest))
    OPEN_ESCALATIONS.set(open_count)
    OLDEST_OPEN_ESCALATION_AGE.set(float(oldest_open))
    for status in ExecutionStatus:
        CALLS.labels(status.value).set(by_status.get(status.value, (0, 0.0))[0])
    OLDEST_ACCEPTED_AGE.set(by_status.get(ExecutionStatus.ACCEPTED.value, (0, 0.0))[1])


def _age(at: Any) -> Any:
    """Seconds since the earliest ``at`` (0 when there is none)."""
    return func.coalesce(func.extract("epoch", func.now() - func.min(at)), 0)
