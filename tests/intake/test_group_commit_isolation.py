"""Group commit isolates a submission whose rows the database refuses: only that one
fails (400, the input's fault), every other submission of the batch commits."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import tool_calls
from dispatcher.errors import ValidationFailed
from dispatcher.intake.batcher import IntakeBatcher
from dispatcher.schemas import Submission, SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS

pytestmark = pytest.mark.postgres


def _good(i: int) -> SubmitRequest:
    return SubmitRequest(
        run_id="run-b",
        capability_id="send-email",
        input={"to": f"b{i}@example.com"},
        idempotency_key=f"b-{i}",
        tool_call_id=f"tc-b-{i}",
    )


def _refused_by_the_database(i: int) -> SubmitRequest:
    """Built past validation (``model_construct``), so that the refusal comes from
    PostgreSQL itself, whatever intake validates: a run id too long for the btree index
    on runs (54000, random so it does not compress), or a NUL in jsonb text (22P05)."""
    fields = (
        {"run_id": secrets.token_hex(4000), "input": {"to": "a@example.com"}}
        if i % 2
        else {"run_id": "run-a", "input": {"a": "x\u0000y"}}
    )
    return SubmitRequest.model_construct(
        capability_id="send-email",
        idempotency_key=f"a-{i}",
        tool_call_id=f"tc-a-{i}",
        turn_id=None,
        correlation_id=None,
        causation_id=None,
        reasoning_object_id=None,
        **fields,
    )


async def test_rows_the_database_refuses_fail_only_their_own_submissions(
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
) -> None:
    batcher = IntakeBatcher(engine, registry, topics=DEFAULT_TOPICS, max_batch=128, flushers=1)
    items = [("globex", _good(i)) for i in range(60)]
    items[5:5] = [("acme", _refused_by_the_database(i)) for i in range(6)]
    tasks = [asyncio.create_task(batcher.submit(req, tenant)) for tenant, req in items]
    # Every submission queued before the flusher starts: all of them in one batch.
    while batcher._queue.qsize() < len(items):  # noqa: ASYNC110 - no clock: each task's first step
        await asyncio.sleep(0)
    batcher.start()
    try:
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await batcher.stop()

    for (tenant, _), outcome in zip(items, outcomes, strict=True):
        if tenant == "globex":
            assert isinstance(outcome, Submission), outcome
            assert outcome.created
        else:
            assert isinstance(outcome, ValidationFailed), outcome
            assert outcome.status == 400
            assert outcome.detail.startswith("the database refused the submission: ")
            assert outcome.extra["sqlstate"] in {"54000", "22P05"}
    async with sessions() as session:
        by_tenant = dict(
            (
                await session.execute(
                    select(tool_calls.c.tenant, func.count()).group_by(tool_calls.c.tenant)
                )
            ).all()
        )
    assert by_tenant == {"globex": 60}
