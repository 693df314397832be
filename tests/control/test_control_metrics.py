"""The control room's metrics move when their facts happen: an approval decided or
expired (how long it waited, by decision) and an escalation opened. Real PostgreSQL,
through the library functions the API and the sweeper call."""

from __future__ import annotations

import pytest
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control import approvals
from dispatcher.control.actor import Actor
from dispatcher.control.escalations import escalate
from dispatcher.db.tables import approvals as approvals_table
from dispatcher.errors import TransitionConflict
from dispatcher.schemas import DecisionRequest
from dispatcher.states import ExecutionStatus as S
from tests.fixtures.calls import insert_unknown_calls, submit_call
from tests.fixtures.capabilities import approval_capability
from tests.fixtures.metrics import sample
from tests.fixtures.rows import approval_of

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("labels_stay_bounded")]

Sessions = async_sessionmaker[AsyncSession]


WAIT = "tool_dispatcher_approval_wait_seconds"
DECISIONS = "tool_dispatcher_approval_decisions_total"


@pytest.fixture
def registry() -> CapabilityRegistry:
    cap = approval_capability("refund-big")
    return CapabilityRegistry({cap.id: cap})


async def proposed(sessions: Sessions, registry: CapabilityRegistry, key: str, age: int) -> str:
    """A proposed call whose approval was created ``age`` seconds ago; its approval id."""
    call = await submit_call(sessions, registry, "refund-big", {"orderId": key}, key=key)
    approval_id = str((await approval_of(sessions, call))["approval_id"])
    async with sessions() as session, session.begin():
        await session.execute(
            update(approvals_table)
            .where(approvals_table.c.approval_id == approval_id)
            .values(created_at=text(f"now() - interval '{age} seconds'"))
        )
    return approval_id


def waited(decision: str) -> tuple[float, float, float, float]:
    """Count, sum, and the buckets up to 60 s and up to 120 s of one decision."""
    return (
        sample(f"{WAIT}_count", decision=decision),
        sample(f"{WAIT}_sum", decision=decision),
        sample(f"{WAIT}_bucket", decision=decision, le="60.0"),
        sample(f"{WAIT}_bucket", decision=decision, le="120.0"),
    )


@pytest.mark.parametrize("verdict, decision", [("approve", "approved"), ("reject", "rejected")])
async def test_a_decision_is_counted_with_how_long_it_waited(
    sessions: Sessions, registry: CapabilityRegistry, verdict: str, decision: str
) -> None:
    approval_id = await proposed(sessions, registry, f"m-{verdict}", age=90)
    count, total, upto60, upto120 = waited(decision)
    decided = sample(DECISIONS, decision=decision)

    async with sessions() as session, session.begin():
        await approvals.decide(
            session, approval_id, DecisionRequest(decision=verdict),
            actor=Actor("bob", "acme", "api"), scopes={"approve"}, tenant="acme",
            registry=registry,
        )  # fmt: skip

    after = waited(decision)
    assert sample(DECISIONS, decision=decision) == decided + 1
    assert after[0] == count + 1
    assert 90 <= after[1] - total < 120  # created 90 s ago, decided now
    assert (after[2], after[3]) == (upto60, upto120 + 1)


async def test_an_expiry_is_counted_as_a_decision_with_its_wait(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    approval_id = await proposed(sessions, registry, "m-expire", age=30)
    open_one = await proposed(sessions, registry, "m-open", age=30)
    async with sessions() as session, session.begin():
        await session.execute(
            update(approvals_table)
            .where(approvals_table.c.approval_id == approval_id)
            .values(expires_at=text("now() - interval '1 second'"))
        )
    count, total, _, _ = waited("expired")
    expired = sample(DECISIONS, decision="expired")

    async with sessions() as session, session.begin():
        assert await approvals.expire_due(session) == [approval_id]

    assert sample(DECISIONS, decision="expired") == expired + 1  # not the open one
    after = waited("expired")
    assert after[0] == count + 1 and 30 <= after[1] - total < 60
    assert (await approval_of_id(sessions, open_one)) == "pending"


async def approval_of_id(sessions: Sessions, approval_id: str) -> str:
    async with sessions() as session:
        status: str = (
            await session.execute(
                approvals_table.select()
                .with_only_columns(approvals_table.c.status)
                .where(approvals_table.c.approval_id == approval_id)
            )
        ).scalar_one()
    return status


async def test_an_opened_escalation_is_counted_once(sessions: Sessions) -> None:
    opened = "tool_dispatcher_escalations_opened_total"
    (call,) = await insert_unknown_calls(sessions, ["m-esc"], "send")
    before = sample(opened, capability="send")

    async def open_it() -> None:
        async with sessions() as session, session.begin():
            await escalate(
                session, call, tenant="acme", expected=S.RESULT_UNKNOWN,
                reason="lookups kept timing out", evidence={},
                producer="tool-dispatcher.reconciler",
            )  # fmt: skip

    await open_it()
    assert sample(opened, capability="send") == before + 1
    with pytest.raises(TransitionConflict):
        await open_it()  # already escalated: nothing opened, nothing counted
    assert sample(opened, capability="send") == before + 1
