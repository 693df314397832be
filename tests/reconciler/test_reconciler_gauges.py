"""The gauges the reconciler reads from the database: calls per in-flight status (zeros
included, finished statuses never), the oldest ``accepted`` call's age and the oldest
unresolved escalation's age. Real PostgreSQL, this test's own database."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.control.actor import Actor
from dispatcher.control.escalations import escalate, resolve
from dispatcher.db.tables import escalations, tool_calls
from dispatcher.schemas import Finding
from dispatcher.states import IN_FLIGHT_STATES, TERMINAL_STATES
from dispatcher.states import ExecutionStatus as S
from reconciler import metrics
from tests.fixtures.calls import insert_call, insert_unknown_calls
from tests.fixtures.metrics import sample

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("labels_stay_bounded")]

Sessions = async_sessionmaker[AsyncSession]


def ago(seconds: int) -> object:
    return text(f"now() - interval '{seconds} seconds'")


async def test_calls_per_status_and_the_oldest_ages(sessions: Sessions) -> None:
    for status, n in (("authorized", 2), ("completed", 3)):
        for _ in range(n):
            await insert_call(sessions, status)
    young = await insert_call(sessions, "accepted", accepted_at=ago(10))
    old = await insert_call(sessions, "accepted", accepted_at=ago(100))
    (stuck,) = await insert_unknown_calls(sessions, ["g-esc"], "send")
    async with sessions() as session, session.begin():
        await escalate(
            session, stuck, tenant="acme", expected=S.RESULT_UNKNOWN, reason="no answer",
            evidence={}, producer="tool-dispatcher.reconciler",
        )  # fmt: skip
        await session.execute(update(escalations).values(created_at=ago(50)))

    await metrics.refresh(sessions)

    counts = {
        s.value: REGISTRY.get_sample_value("tool_dispatcher_calls", {"status": s.value}) for s in S
    }
    # The finished calls are counted as they finish (tool_dispatcher_transitions_total).
    assert counts == {
        **{s.value: None for s in TERMINAL_STATES},
        **{s.value: 0.0 for s in IN_FLIGHT_STATES},
        "authorized": 2.0,
        "accepted": 2.0,
        "escalated": 1.0,
    }  # fmt: skip
    assert 100 <= sample("tool_dispatcher_oldest_accepted_age_seconds") < 110
    oldest_open = "tool_dispatcher_reconciler_oldest_open_escalation_age_seconds"
    assert 50 <= sample(oldest_open) < 60
    assert sample("tool_dispatcher_reconciler_open_escalations") == 1

    # The old one moves on: the young one is now the oldest; none left, 0.
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls).where(tool_calls.c.tool_call_id == old).values(status="completed")
        )
    await metrics.refresh(sessions)
    assert 10 <= sample("tool_dispatcher_oldest_accepted_age_seconds") < 20
    assert sample("tool_dispatcher_calls", status="accepted") == 1
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls).where(tool_calls.c.tool_call_id == young).values(status="completed")
        )
        escalation_id = (await session.execute(escalations.select())).one().escalation_id
        await resolve(
            session, escalation_id, finding=Finding.CONFIRMED_SUCCESS, reason="checked",
            actor=Actor("bob", "acme", "api"), tenant="acme",
        )  # fmt: skip
    await metrics.refresh(sessions)
    assert sample("tool_dispatcher_oldest_accepted_age_seconds") == 0
    assert sample(oldest_open) == 0
