"""What is due: the reads that decide which calls leave, and what goes with them.

A call is due when all of these hold:

- it is terminal (:data:`dispatcher.states.TERMINAL_STATES`) and the reconciler no
  longer follows it (reconciliation not pending);
- its last change (``updated_at``) is older than its tenant's retention;
- its provider's idempotency window (the capability's
  ``reconcile.idempotencyWindowSeconds``, from ``dispatched_at``) has closed;
- it has no escalation still open or acknowledged, and no approval still pending.

Everything else stays: escalated, result_unknown, accepted, proposed, authorized,
dispatching. Each tenant is read on its own, oldest change first, through
``ix_tool_calls_terminal_since``, so a tenant kept longer is never scanned past.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import RowMapping, bindparam, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import approvals, escalations, execution_events, tool_calls
from dispatcher.ledger.retention import Member
from dispatcher.retention.policy import RetentionPolicy
from dispatcher.states import TERMINAL_STATES, ApprovalStatus, EscalationStatus

# Written into the text, not bound: the partial index's predicate must be provable.
_TERMINAL = "status IN ({})".format(", ".join(f"'{s.value}'" for s in sorted(TERMINAL_STATES)))

# The tenants with terminal calls: a loose index scan (one index probe per tenant).
_TENANTS = text(
    f"""WITH RECURSIVE t(tenant) AS (
        (SELECT tenant FROM tool_calls WHERE {_TERMINAL} ORDER BY tenant LIMIT 1)
        UNION ALL
        SELECT (SELECT c.tenant FROM tool_calls c
                WHERE c.{_TERMINAL} AND c.tenant > t.tenant ORDER BY c.tenant LIMIT 1)
        FROM t WHERE t.tenant IS NOT NULL
    )
    SELECT tenant FROM t WHERE tenant IS NOT NULL"""  # noqa: S608 - constant text
)

_DUE = f"""
    FROM tool_calls c
    WHERE c.tenant = :tenant AND c.{_TERMINAL} AND c.updated_at < :cutoff
      AND c.reconciliation_status <> 'pending'
      AND (c.dispatched_at IS NULL OR c.dispatched_at < :now - make_interval(
            secs => coalesce((CAST(:windows AS jsonb) ->> c.capability_id)::float8, :unknown)))
      AND NOT EXISTS (
          SELECT 1 FROM escalations e
          WHERE e.tenant = c.tenant AND e.tool_call_id = c.tool_call_id
            AND e.status <> '{EscalationStatus.RESOLVED.value}')
      AND NOT EXISTS (
          SELECT 1 FROM approvals a
          WHERE a.tenant = c.tenant AND a.tool_call_id = c.tool_call_id
            AND a.status = '{ApprovalStatus.PENDING.value}')
"""  # noqa: S608 - constant text, every value bound
_DUE_BATCH = text(
    f"SELECT c.tool_call_id, c.version, c.updated_at {_DUE} ORDER BY c.updated_at LIMIT :limit"
).bindparams(bindparam("windows", type_=JSONB))
_DUE_COUNT = text(
    f"SELECT count(*) FROM (SELECT 1 {_DUE} LIMIT :limit) AS due"  # noqa: S608
).bindparams(bindparam("windows", type_=JSONB))

# The gauge counts at most this many due calls per tenant: a count of a backlog of
# millions would cost more than a batch.
COUNT_CAP = 100_000


async def tenants(session: AsyncSession) -> list[str]:
    return list((await session.execute(_TENANTS)).scalars())


def _params(policy: RetentionPolicy, tenant: str, now: datetime) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "cutoff": policy.cutoff(tenant, now),
        "now": now,
        "windows": dict(policy.windows),
        "unknown": policy.unknown_window(),
    }


async def due_batch(
    session: AsyncSession, policy: RetentionPolicy, tenant: str, now: datetime
) -> list[Member]:
    """Up to a batch of ``tenant``'s due calls, oldest change first."""
    rows = await session.execute(
        _DUE_BATCH, {**_params(policy, tenant, now), "limit": policy.batch_size}
    )
    return [Member(r.tool_call_id, r.version, r.updated_at) for r in rows]


async def due_count(
    session: AsyncSession, policy: RetentionPolicy, tenant: str, now: datetime
) -> int:
    """``tenant``'s due calls, up to :data:`COUNT_CAP`."""
    params = {**_params(policy, tenant, now), "limit": COUNT_CAP}
    return int((await session.execute(_DUE_COUNT, params)).scalar_one())


async def batch_rows(
    session: AsyncSession, tenant: str, ids: Sequence[str]
) -> dict[str, list[RowMapping]]:
    """Every stored row of the calls ``ids``: ``calls``, ``events`` (in log order),
    ``approvals``, ``escalations``."""
    calls = [
        r._mapping
        for r in await session.execute(
            select(tool_calls).where(
                tool_calls.c.tenant == tenant, tool_calls.c.tool_call_id.in_(ids)
            )
        )
    ]
    # A call's events are no older than the call (less a day for clocks apart): the
    # earlier days of the log are not searched.
    since = min((c["created_at"] for c in calls), default=datetime.now().astimezone())
    ev = execution_events.c
    events = await session.execute(
        select(execution_events)
        .where(
            ev.tenant == tenant,
            ev.tool_call_id.in_(ids),
            ev.occurred_at >= since - timedelta(days=1),
        )
        .order_by(ev.seq)
    )
    found: dict[str, list[RowMapping]] = {"calls": calls, "events": [r._mapping for r in events]}
    for name, table in (("approvals", approvals), ("escalations", escalations)):
        rows = await session.execute(
            select(table).where(table.c.tenant == tenant, table.c.tool_call_id.in_(ids))
        )
        found[name] = [r._mapping for r in rows]
    return found
