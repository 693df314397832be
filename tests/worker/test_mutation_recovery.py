"""What the recovery sweep leaves behind for the reconciler and for the next worker,
and which lapsed claims one sweep takes: mutants of ``dispatcher/worker/recovery.py``
that the recovery tests let live
(``python -m bench.mutation --module dispatcher/worker/recovery.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.ledger.messages import Producer, ce_source
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.tenancy import ordering_key
from dispatcher.testing.registries import capability, registry_of
from dispatcher.worker.recovery import recover_expired
from tests.fixtures.calls import insert_call
from tests.fixtures.rows import call_row, events_of, outbox_rows

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
# Topics of this deployment's own: recovery must write where it is told to.
TOPICS = Topics(dispatch="site.commands", events="site.events", escalations="site.escalations")
REGISTRY = registry_of(capability("refund"), capability("lookup", side_effects=False))


async def lapsed(sessions: Sessions, cap_id: str, seconds_ago: int = 5) -> str:
    """A call claimed by ``worker-dead`` whose lease ran out ``seconds_ago``."""
    return await insert_call(
        sessions,
        "dispatching",
        cap_id=cap_id,
        lease_owner="worker-dead",
        lease_expires_at=text(f"now() - interval '{seconds_ago} seconds'"),
        version=3,
    )


async def now(sessions: Sessions) -> Any:
    async with sessions() as session:
        return (await session.execute(text("SELECT now()"))).scalar_one()


async def test_a_lost_side_effect_is_handed_to_the_reconciler_due_at_once(
    sessions: Sessions,
) -> None:
    call = await lapsed(sessions, "refund")
    report = await recover_expired(sessions, REGISTRY, topics=TOPICS)
    assert (report.marked_unknown, report.redispatched) == ([call], [])
    assert [r["key"] for r in await outbox_rows(sessions, TOPICS.events)] == [
        ordering_key("acme", "run-1")
    ]

    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"], row["reconciliation_status"]) == (
        "result_unknown",
        "pending",
        "pending",
    )
    assert row["last_error"] == "worker_lost: outcome not recorded"
    assert (row["lease_owner"], row["lease_expires_at"]) == (None, None)
    assert row["next_reconcile_at"] is not None and row["next_reconcile_at"] <= await now(sessions)
    event = (await events_of(sessions, call))[-1]
    assert event["payload"] == {
        "from": ["dispatching"],
        "to": "result_unknown",
        "reason": "worker lost between claim and outcome (lease expired)",
        "deadWorker": "worker-dead",
        "claimVersion": 3,
        "rule": "mark_unknown",
    }


async def test_a_call_of_an_unregistered_capability_is_never_sent_again(
    sessions: Sessions,
) -> None:
    call = await lapsed(sessions, "retired")
    report = await recover_expired(sessions, REGISTRY, topics=DEFAULT_TOPICS)
    assert report.marked_unknown == [call]
    assert (await call_row(sessions, call))["status"] == "result_unknown"


async def test_a_lost_read_is_sent_again_by_a_command_caused_by_its_redispatch(
    sessions: Sessions,
) -> None:
    call = await lapsed(sessions, "lookup")
    report = await recover_expired(sessions, REGISTRY, topics=TOPICS)
    assert (report.redispatched, report.marked_unknown) == ([call], [])

    row = await call_row(sessions, call)
    assert (row["status"], row["lease_owner"], row["lease_expires_at"]) == (
        "authorized",
        None,
        None,
    )
    event = (await events_of(sessions, call))[-1]
    assert event["payload"]["rule"] == "redispatch"
    assert event["payload"]["deadWorker"] == "worker-dead"
    [command] = [
        r
        for r in await outbox_rows(sessions, TOPICS.dispatch)
        if r["key"] == ordering_key("acme", call)
    ]
    assert command["payload"]["causationId"] == str(event["event_id"])
    assert command["headers"]["ce_source"] == ce_source(Producer.RECOVERY)
    assert [r["key"] for r in await outbox_rows(sessions, TOPICS.events)] == [
        ordering_key("acme", "run-1")
    ]


async def test_one_sweep_takes_at_most_its_limit_oldest_lease_first(sessions: Sessions) -> None:
    newer = await lapsed(sessions, "refund", seconds_ago=5)
    older = await lapsed(sessions, "refund", seconds_ago=50)
    fresh = await insert_call(
        sessions,
        "dispatching",
        cap_id="refund",
        lease_owner="worker-alive",
        lease_expires_at=text("now() + interval '60 seconds'"),
    )
    first = await recover_expired(sessions, REGISTRY, topics=DEFAULT_TOPICS, limit=1)
    assert first.marked_unknown == [older]
    second = await recover_expired(sessions, REGISTRY, topics=DEFAULT_TOPICS, limit=1)
    assert second.marked_unknown == [newer]
    assert (await recover_expired(sessions, REGISTRY, topics=DEFAULT_TOPICS)).total == 0
    assert (await call_row(sessions, fresh))["status"] == "dispatching"
