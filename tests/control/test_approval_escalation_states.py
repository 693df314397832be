"""The approval and escalation lifecycles: their transition tables, checked against an
independent copy, and the one UPDATE shape that moves them
(``dispatcher.control.statuses``), run against the real database."""

from __future__ import annotations

import itertools
import uuid

import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.control.statuses import approval_update, escalation_update
from dispatcher.db.tables import approvals, escalations
from dispatcher.errors import IllegalTransition
from dispatcher.states import (
    APPROVAL_TRANSITIONS,
    ESCALATION_TRANSITIONS,
    ApprovalStatus,
    EscalationStatus,
    check_approval_transition,
    check_escalation_transition,
)

A = ApprovalStatus
E = EscalationStatus

# Decided once: pending is the only state anything leaves.
APPROVAL_EDGES = frozenset(
    (A.PENDING, target) for target in (A.APPROVED, A.REJECTED, A.EXPIRED, A.CANCELLED)
)
ESCALATION_EDGES = frozenset(
    {(E.OPEN, E.ACKNOWLEDGED), (E.OPEN, E.RESOLVED), (E.ACKNOWLEDGED, E.RESOLVED)}
)


def test_the_tables_list_every_status_and_exactly_the_intended_edges() -> None:
    assert set(APPROVAL_TRANSITIONS) == set(ApprovalStatus)
    assert set(ESCALATION_TRANSITIONS) == set(EscalationStatus)
    assert {(s, t) for s, ts in APPROVAL_TRANSITIONS.items() for t in ts} == APPROVAL_EDGES
    assert {(s, t) for s, ts in ESCALATION_TRANSITIONS.items() for t in ts} == ESCALATION_EDGES


@pytest.mark.parametrize(("current", "target"), list(itertools.product(A, A)), ids=str)
def test_check_approval_transition_refuses_exactly_the_moves_not_in_the_table(
    current: ApprovalStatus, target: ApprovalStatus
) -> None:
    if (current, target) in APPROVAL_EDGES:
        check_approval_transition(current, target)
        return
    with pytest.raises(IllegalTransition) as info:
        check_approval_transition(current, target)
    assert info.value.detail == f"an approval in '{current}' cannot move to '{target}'"


@pytest.mark.parametrize(("current", "target"), list(itertools.product(E, E)), ids=str)
def test_check_escalation_transition_refuses_exactly_the_moves_not_in_the_table(
    current: EscalationStatus, target: EscalationStatus
) -> None:
    if (current, target) in ESCALATION_EDGES:
        check_escalation_transition(current, target)
        return
    with pytest.raises(IllegalTransition) as info:
        check_escalation_transition(current, target)
    assert info.value.detail == f"an escalation in '{current}' cannot move to '{target}'"


def test_a_move_the_table_forbids_is_refused_before_any_sql() -> None:
    with pytest.raises(IllegalTransition):
        approval_update(A.EXPIRED, A.APPROVED)
    with pytest.raises(IllegalTransition):
        escalation_update(E.RESOLVED, E.OPEN)


async def _approval(session: AsyncSession, status: ApprovalStatus) -> str:
    approval_id = f"apr-{uuid.uuid4().hex[:8]}"
    decided = status in (A.APPROVED, A.REJECTED)
    await session.execute(
        insert(approvals).values(
            approval_id=approval_id,
            tool_call_id=f"tc-{approval_id}",
            tenant="acme",
            run_id="run-1",
            capability_id="refund-order-v2",
            risk="high",
            input_hash="h",
            policy_version=1,
            status=status.value,
            expires_at=func.now(),
            closed_at=None if status is A.PENDING else func.now(),
            decision=("approve" if status is A.APPROVED else "reject") if decided else None,
        )
    )
    return approval_id


@pytest.mark.postgres
async def test_an_approval_moves_only_from_the_status_the_caller_saw(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session, session.begin():
        pending = await _approval(session, A.PENDING)
        cancelled = await _approval(session, A.CANCELLED)
        moved = await session.execute(
            approval_update(A.PENDING, A.EXPIRED)
            .where(approvals.c.approval_id.in_([pending, cancelled]))
            .values(closed_at=func.now())
            .returning(approvals.c.approval_id)
        )
        assert moved.scalars().all() == [pending]
        statuses = dict(
            (await session.execute(select(approvals.c.approval_id, approvals.c.status))).all()
        )
    assert statuses == {pending: "expired", cancelled: "cancelled"}


@pytest.mark.postgres
async def test_an_escalation_moves_only_from_the_status_the_caller_saw(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session, session.begin():
        await session.execute(
            insert(escalations).values(
                escalation_id="esc-1",
                tool_call_id="tc-1",
                tenant="acme",
                episode=1,
                status=E.RESOLVED.value,
                reason="r",
                evidence={},
            )
        )
        moved = await session.execute(
            escalation_update(E.OPEN, E.ACKNOWLEDGED)
            .where(escalations.c.escalation_id == "esc-1")
            .returning(escalations.c.escalation_id)
        )
        assert moved.all() == []
        status = (await session.execute(select(escalations.c.status))).scalar_one()
    assert status == "resolved"
