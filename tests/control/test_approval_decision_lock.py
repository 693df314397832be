"""Two decisions on one approval, overlapping for certain: the second waits for the
first and then finds the approval decided.

``approvals.decide`` reads the approval row ``FOR UPDATE`` and acts only on a pending
one: the lock is what makes "the first decision wins, every later one reads
``approval_already_decided``" true when decisions overlap. Concurrent HTTP requests
(tests/control/test_approvals.py) rarely overlap inside that window, so without the
lock they still pass. Here the overlap is forced: the first decision is made in a
transaction the test holds open, the second is started meanwhile and must block on
the approval row until the first commits.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control import approvals
from dispatcher.control.actor import Actor
from dispatcher.db.tables import approvals as approvals_table
from dispatcher.db.tables import tool_calls
from dispatcher.errors import ApprovalAlreadyDecided
from dispatcher.intake.service import submit
from dispatcher.schemas import ApprovalView, DecisionRequest, SubmitRequest
from dispatcher.states import ExecutionStatus as S
from tests.fixtures.capabilities import approval_capability
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
TENANT = "acme"
CAP = "refund-big"
REGISTRY = CapabilityRegistry({CAP: approval_capability(CAP)})
BOB = Actor("bob", TENANT, "api")
CAROL = Actor("carol", TENANT, "api")


async def _propose(sessions: Sessions, tool_call_id: str) -> str:
    """The call ``tool_call_id``, submitted by alice, needing approval; its approval id."""
    async with sessions() as session, session.begin():
        await submit(
            session,
            SubmitRequest(
                run_id="run-1",
                capability_id=CAP,
                tool_call_id=tool_call_id,
                input={"orderId": "o-1"},
            ),
            tenant=TENANT,
            registry=REGISTRY,
            submitted_by="alice",
        )
        found = await session.execute(
            select(approvals_table.c.approval_id).where(
                approvals_table.c.tenant == TENANT,
                approvals_table.c.tool_call_id == tool_call_id,
            )
        )
        return str(found.scalar_one())


async def _decide(
    session: AsyncSession, approval_id: str, verdict: str, actor: Actor
) -> ApprovalView:
    return await approvals.decide(
        session,
        approval_id,
        DecisionRequest(decision=verdict, reason=f"{actor.name} says {verdict}"),
        actor=actor,
        scopes={"approve"},
        tenant=TENANT,
        registry=REGISTRY,
    )


async def _waiting_on(sessions: Sessions, holder: int) -> list[tuple[int, str | None]]:
    """Backends blocked by ``holder``, each with the table of the row it waits for (the
    tuple lock a row-lock waiter holds while it waits for the holder's transaction)."""
    async with sessions() as session:
        rows = await session.execute(
            text(
                "SELECT a.pid, (SELECT l.relation::regclass::text FROM pg_locks l "
                "               WHERE l.pid = a.pid AND l.locktype = 'tuple' LIMIT 1) "
                "FROM pg_stat_activity a WHERE :holder = ANY (pg_blocking_pids(a.pid))"
            ),
            {"holder": holder},
        )
        return [(pid, table) for pid, table in rows]


async def test_a_decision_waits_for_one_in_progress_then_finds_it_decided(
    sessions: Sessions,
) -> None:
    """Guards: of two overlapping decisions, the later waits on the approval row's lock
    and, once the first commits, is refused as ``approval_already_decided`` naming the
    first decision -- it never decides again on a stale "pending" read."""
    tool_call_id = "call-1"
    approval_id = await _propose(sessions, tool_call_id)

    async with sessions() as first:
        async with first.begin():
            approved = await _decide(first, approval_id, "approve", BOB)
            assert approved.decision == "approve"
            holder = (await first.execute(text("SELECT pg_backend_pid()"))).scalar_one()

            async def second_decision() -> ApprovalView:
                async with sessions() as session, session.begin():
                    return await _decide(session, approval_id, "reject", CAROL)

            second = asyncio.create_task(second_decision())
            try:

                async def blocked() -> bool:
                    return bool(await _waiting_on(sessions, holder))

                await eventually(blocked, within=30, every=0.02, what="the second to block")
                # It waits on the approval row, behind the decision in progress.
                [(_, table)] = await _waiting_on(sessions, holder)
                assert table == "approvals"
                assert not second.done()
            except BaseException:
                second.cancel()
                raise
        # The first decision commits here.

    with pytest.raises(ApprovalAlreadyDecided) as refused:
        await asyncio.wait_for(second, 30)
    assert refused.value.code == "approval_already_decided"
    assert refused.value.status == 409
    assert refused.value.extra == {
        "approvalId": approval_id,
        "decision": "approve",
        "decidedBy": "bob",
    }

    async with sessions() as session:
        status = await session.execute(
            select(tool_calls.c.status).where(
                tool_calls.c.tenant == TENANT, tool_calls.c.tool_call_id == tool_call_id
            )
        )
        assert status.scalar_one() == S.AUTHORIZED.value
        decided = await session.execute(
            select(
                approvals_table.c.status, approvals_table.c.decision, approvals_table.c.decided_by
            ).where(approvals_table.c.approval_id == approval_id)
        )
        assert tuple(decided.one()) == ("approved", "approve", "bob")
