"""Prometheus metrics of the reconciler (default registry), and the :class:`Tally` a
pass returns.

Outcome and lookup-error counters move as calls are settled; the gauges are read from
the database after every pass, so they describe the whole backlog rather than what
this one process saw.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import escalations, tool_calls
from dispatcher.states import EscalationStatus, ReconciliationStatus

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
    """Set the gauges from the database (two index-backed aggregate queries)."""
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
        open_count = (
            await session.execute(
                select(func.count()).where(escalations.c.status != EscalationStatus.RESOLVED.value)
            )
        ).scalar_one()
    UNKNOWN_BACKLOG.set(backlog)
    OLDEST_UNKNOWN_AGE.set(float(oldest))
    OPEN_ESCALATIONS.set(open_count)
