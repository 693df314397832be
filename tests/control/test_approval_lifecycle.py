"""Approvals at the service level, on real PostgreSQL: two tenants' calls with one
toolCallId are decided and expired apart; each refusal names what it refuses; the
sweeper's boundary (due at its expiry instant), order, limit and skipping of a locked row;
the listing's order and limit; and the library's own check of the approve scope."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control import approvals
from dispatcher.control.actor import Actor
from dispatcher.db.tables import approvals as approvals_table
from dispatcher.db.tables import outbox, runs, tool_calls
from dispatcher.errors import (
    ApprovalNotFound,
    ApprovalStale,
    CapabilityUnavailable,
    DispatcherError,
    Forbidden,
    RunStopped,
    SelfApprovalForbidden,
)
from dispatcher.intake.service import submit
from dispatcher.schemas import DecisionRequest, SubmitRequest
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.views import queues
from tests.fixtures.capabilities import approval_capability, with_capability, without_capability

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
SHARED = "shared-1"
CAP = "refund-four-eyes"
REGISTRY = CapabilityRegistry({CAP: approval_capability(CAP, forbidSelfApproval=True)})
BOB = Actor("bob", "acme", "api")
TOPICS = Topics(events="apr-test.events")


async def propose(sessions: Sessions, tenant: str, tool_call_id: str = SHARED) -> str:
    """The tenant's call ``tool_call_id`` (submitted by alice), proposed; its approval id."""
    async with sessions() as session, session.begin():
        await submit(
            session,
            SubmitRequest(
                run_id="run-1",
                capability_id=CAP,
                tool_call_id=tool_call_id,
                input={"orderId": f"o-{tenant}"},
            ),
            tenant=tenant,
            registry=REGISTRY,
            submitted_by="alice",
        )
        found = await session.execute(
            select(approvals_table.c.approval_id).where(
                approvals_table.c.tenant == tenant, approvals_table.c.tool_call_id == tool_call_id
            )
        )
        return str(found.scalar_one())


async def state(sessions: Sessions, tenant: str, tool_call_id: str = SHARED) -> tuple[str, str]:
    """(call status, approval status) of the tenant's call."""
    async with sessions() as session:
        call = (
            await session.execute(
                select(tool_calls.c.status).where(
                    tool_calls.c.tenant == tenant, tool_calls.c.tool_call_id == tool_call_id
                )
            )
        ).scalar_one()
        approval = (
            await session.execute(
                select(approvals_table.c.status).where(
                    approvals_table.c.tenant == tenant,
                    approvals_table.c.tool_call_id == tool_call_id,
                )
            )
        ).scalar_one()
    return call, approval


async def decide(
    sessions: Sessions,
    approval_id: str,
    tenant: str,
    verdict: str = "approve",
    actor: Actor = BOB,
    registry: CapabilityRegistry = REGISTRY,
) -> Any:
    async with sessions() as session, session.begin():
        return await approvals.decide(
            session, approval_id, DecisionRequest(decision=verdict, reason=f"{tenant} says so"),
            actor=actor, scopes={"approve"}, tenant=tenant, registry=registry,
        )  # fmt: skip


async def test_two_tenants_one_tool_call_id_are_decided_apart(sessions: Sessions) -> None:
    acme, globex = await propose(sessions, "acme"), await propose(sessions, "globex")
    with pytest.raises(ApprovalNotFound):  # acme's approval, decided as globex
        await decide(sessions, acme, "globex")

    approved = await decide(sessions, acme, "acme")
    assert (approved.decision, approved.decided_by) == ("approve", "bob")
    assert approved.decision_reason == "acme says so"
    assert await state(sessions, "acme") == (S.AUTHORIZED.value, "approved")
    assert await state(sessions, "globex") == (S.PROPOSED.value, "pending")

    rejected = await decide(sessions, globex, "globex", "reject")
    assert rejected.decision_reason == "globex says so"
    assert await state(sessions, "globex") == (S.REJECTED.value, "rejected")
    assert await state(sessions, "acme") == (S.AUTHORIZED.value, "approved")


async def refused(sessions: Sessions, approval_id: str, **how: Any) -> DispatcherError:
    with pytest.raises(DispatcherError) as caught:
        await decide(sessions, approval_id, "acme", **how)
    return caught.value


async def test_each_refusal_names_what_it_refuses(sessions: Sessions) -> None:
    apr = await propose(sessions, "acme")
    cap = REGISTRY.get(CAP)
    cases: list[tuple[Callable[[], Any], type[DispatcherError], dict[str, Any], str]] = [
        (
            lambda: refused(sessions, apr, actor=Actor("alice", "acme", "api")),
            SelfApprovalForbidden,
            {"approvalId": apr},
            "'alice' submitted this call and cannot approve it",
        ),
        (
            lambda: refused(sessions, apr, registry=without_capability(REGISTRY, CAP)),
            CapabilityUnavailable,
            {"capabilityId": CAP},
            f"capability {CAP!r} is no longer registered",
        ),
        (
            lambda: refused(
                sessions,
                apr,
                registry=with_capability(REGISTRY, cap.model_copy(update={"enabled": False})),
            ),
            CapabilityUnavailable,
            {"capabilityId": CAP},
            f"capability {CAP!r} is disabled",
        ),
        (
            lambda: refused(
                sessions,
                apr,
                verdict="reject",
                registry=with_capability(
                    REGISTRY, cap.model_copy(update={"policy_version": cap.policy_version + 1})
                ),
            ),
            ApprovalStale,
            {"approvalId": apr, "changed": "policy version"},
            f"approval {apr!r} was asked for another policy version; ask again",
        ),
    ]
    for attempt, kind, extra, detail in cases:
        error = await attempt()
        assert (type(error), error.extra, error.detail) == (kind, extra, detail)

    async with sessions() as session, session.begin():
        # A stop whose cancelling of the approval this decision got ahead of.
        await session.execute(
            insert(runs)
            .values(tenant="acme", run_id="run-1", stopped_at=func.now())
            .on_conflict_do_update(
                index_elements=[runs.c.tenant, runs.c.run_id], set_={"stopped_at": func.now()}
            )
        )
    error = await refused(sessions, apr)
    assert (type(error), error.extra) == (RunStopped, {"runId": "run-1"})

    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls).where(tool_calls.c.tenant == "acme").values(input={"orderId": "x"})
        )
    error = await refused(sessions, apr, verdict="reject")
    assert (type(error), error.extra) == (ApprovalStale, {"approvalId": apr, "changed": "input"})
    assert await state(sessions, "acme") == (S.PROPOSED.value, "pending")


async def set_expiry(session: AsyncSession, approval_id: str, expires_at: Any) -> None:
    await session.execute(
        update(approvals_table)
        .where(approvals_table.c.approval_id == approval_id)
        .values(expires_at=expires_at)
    )


async def test_the_sweeper_expires_each_tenants_own_due_approvals_earliest_first(
    sessions: Sessions,
) -> None:
    acme, globex = await propose(sessions, "acme"), await propose(sessions, "globex")
    decided = await propose(sessions, "acme", "decided-1")
    await decide(sessions, decided, "acme")
    async with sessions() as session, session.begin():
        # The later one is written first and sorts first by tenant, so neither the
        # table's order nor its (tenant, status) index's is the answer.
        await set_expiry(session, acme, func.now() - func.make_interval(0, 0, 0, 0, 0, 1))
        await set_expiry(session, globex, func.now() - func.make_interval(0, 0, 0, 0, 0, 2))
        await set_expiry(session, decided, func.now() - func.make_interval(0, 0, 0, 0, 0, 3))
    async with sessions() as session, session.begin():
        # Without the pending-expiry index, whose order would hide a missing ORDER BY.
        await session.execute(text("SET LOCAL enable_indexscan = off"))
        await session.execute(text("SET LOCAL enable_bitmapscan = off"))
        assert await approvals.expire_due(session, limit=1, topics=TOPICS) == [globex]
        expiry = (
            await session.execute(
                select(approvals_table.c.expires_at).where(approvals_table.c.approval_id == globex)
            )
        ).scalar_one()
    assert await state(sessions, "globex") == (S.CANCELLED.value, "expired")
    assert await state(sessions, "acme") == (S.PROPOSED.value, "pending")
    async with sessions() as session:
        completed = await session.execute(
            select(tool_calls.c.tenant, tool_calls.c.completed_at).where(
                tool_calls.c.tool_call_id == SHARED
            )
        )
        expired = (
            await session.execute(select(outbox.c.payload).where(outbox.c.topic == TOPICS.events))
        ).scalar_one()
        assert expired.get("payload") == {
            "from": [S.PROPOSED.value],
            "to": S.CANCELLED.value,
            "approvalId": globex,
            "expiresAt": expiry.isoformat(),
        }
        # The expired call is finished; acme's, still pending, is not.
        assert {t: at is not None for t, at in completed} == {"globex": True, "acme": False}

    async with sessions() as session, session.begin():
        assert await approvals.expire_due(session) == [acme]
    assert await state(sessions, "acme") == (S.CANCELLED.value, "expired")
    assert await state(sessions, "acme", "decided-1") == (S.AUTHORIZED.value, "approved")


async def test_the_sweeper_takes_an_approval_at_its_expiry_instant_and_skips_a_locked_one(
    sessions: Sessions,
) -> None:
    locked, due = await propose(sessions, "acme"), await propose(sessions, "globex")
    async with sessions() as session, session.begin():
        await set_expiry(session, locked, func.now())
    async with sessions() as holder, holder.begin():
        # A decision in progress holds its approval's row.
        await holder.execute(
            select(approvals_table).where(approvals_table.c.approval_id == locked).with_for_update()
        )
        async with sessions() as session, session.begin():
            # now() is the transaction's start: the approval expires at this very instant.
            await set_expiry(session, due, func.now())
            swept = await asyncio.wait_for(approvals.expire_due(session), timeout=5)
    assert swept == [due]
    assert await state(sessions, "acme") == (S.PROPOSED.value, "pending")


async def test_the_listing_is_the_tenants_own_expiring_soonest_first(sessions: Sessions) -> None:
    ids = [await propose(sessions, "acme", f"tc-{n}") for n in range(3)]
    await propose(sessions, "globex")
    # The highest id expires soonest, so the id is not the order; the other two tie on
    # expiry, broken by id, the higher written first so the table's order is not either.
    low, high, third = sorted(ids)
    async with sessions() as session, session.begin():
        await set_expiry(session, high, func.now() + func.make_interval(0, 0, 0, 0, 1))
        await set_expiry(session, low, func.now() + func.make_interval(0, 0, 0, 0, 1))
        await set_expiry(session, third, func.now() + func.make_interval(0, 0, 0, 0, 0, 1))
    async with sessions() as session, session.begin():
        await session.execute(text("SET LOCAL enable_indexscan = off"))
        await session.execute(text("SET LOCAL enable_bitmapscan = off"))
        listed = [v.approval_id for v in await queues.list_approvals(session, tenant="acme")]
        two = await queues.list_approvals(session, tenant="acme", limit=2)
    assert listed == [third, low, high]
    assert [v.approval_id for v in two] == [third, low]


async def test_a_key_without_the_approve_scope_decides_nothing(sessions: Sessions) -> None:
    # The library call checks the scope itself: a caller inside its own transaction has
    # no API dependency in front of it.
    apr = await propose(sessions, "acme")
    with pytest.raises(Forbidden) as caught:
        async with sessions() as session, session.begin():
            await approvals.decide(
                session, apr, DecisionRequest(decision="approve", reason="no scope"),
                actor=BOB, scopes={"read", "submit"}, tenant="acme", registry=REGISTRY,
            )  # fmt: skip
    error = caught.value
    assert (type(error), error.extra) == (Forbidden, {"scope": "approve"})
    assert error.detail == "this API key lacks the 'approve' scope"
    assert await state(sessions, "acme") == (S.PROPOSED.value, "pending")
