"""The notes a chaos run prints when it does not settle: on real PostgreSQL, with a
real lock held by an open transaction and a real waiter behind it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from devtools.chaos.diagnose import diagnose, worker_summary
from devtools.registries import capability, registry_of
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import outbox
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.tenancy import ordering_key
from tests.fixtures.calls import submit_call

pytestmark = pytest.mark.postgres


@pytest.fixture
def registry() -> CapabilityRegistry:
    return registry_of(capability("refund", "http://127.0.0.1:9"))


def test_a_worker_is_summed_up_by_its_last_move_and_its_last_word(tmp_path: Path) -> None:
    log = tmp_path / "worker-0.log"
    log.write_text(
        "2026-12-02 10:00:01,000 INFO tool_dispatcher.transitions tool call a: x -> y\n"
        "2026-12-02 10:00:02,000 WARNING dispatcher.worker.consumer batch of 3 failed\n"
        "Traceback (most recent call last):\n"
        "    raise error\n"
        "psycopg.OperationalError: connection is bad\n"
        "2026-12-02 10:00:03,000 ERROR aiokafka Unable connect to node with id 111\n"
        "2026-12-02 10:00:04,000 INFO tool_dispatcher.transitions tool call b: x -> y\n"
    )
    assert worker_summary(log) == (
        "last move 2026-12-02 10:00:04; last said: "
        "2026-12-02 10:00:02,000 WARNING dispatcher.worker.consumer batch of 3 failed"
    )
    assert worker_summary(tmp_path / "worker-9.log").startswith("log not readable")


async def test_a_stall_names_the_waiting_sessions_and_the_unclaimed_calls(
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    tmp_path: Path,
) -> None:
    published = await submit_call(sessions, registry, "refund")
    await submit_call(sessions, registry, "refund")
    async with sessions() as session, session.begin():
        await session.execute(
            update(outbox)
            .where(
                outbox.c.key == ordering_key("acme", published),
                outbox.c.topic == DEFAULT_TOPICS.dispatch,
            )
            .values(published_at=text("now() - interval '7 seconds'"))
        )
    (tmp_path / "worker-0.log").write_text("")
    async with engine.connect() as holder, engine.connect() as waiter:
        await holder.execute(text("BEGIN"))
        await holder.execute(
            text("UPDATE tool_calls SET updated_at = now() WHERE tool_call_id = :c"),
            {"c": published},
        )
        await waiter.execute(text("BEGIN"))
        blocked = asyncio.create_task(
            waiter.execute(
                text("UPDATE tool_calls SET updated_at = now() WHERE tool_call_id = :c"),
                {"c": published},
            )
        )
        await asyncio.sleep(0.5)
        notes = await diagnose(engine, tmp_path, DEFAULT_TOPICS.dispatch)
        await holder.rollback()
        await blocked
        await waiter.rollback()
    first, *sessions_seen, worker = notes
    assert first.startswith(
        "diagnosis: 2 call(s) authorized; 1 without a published command, 1 with one "
        "unpublished; newest command published 7."
    )
    waiting = [s for s in sessions_seen if "waiting Lock/transactionid" in s]
    assert len(waiting) == 1
    assert "blocked by 1: UPDATE tool_calls" in waiting[0]
    assert any("idle in transaction" in s and "blocked by 0" in s for s in sessions_seen)
    assert worker == "  worker-0: last move never; last said: nothing"
