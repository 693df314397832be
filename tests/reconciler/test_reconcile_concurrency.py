"""Reconcilers side by side never work the same call twice."""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import execution_events, tool_calls
from dispatcher.provider.transport import Transport
from reconciler import Reconciler, Tally
from reconciler.loop import reconcile_once
from tests.fixtures.calls import insert_unknown_calls, make_due
from tests.fixtures.capabilities import reconcile_capability
from tests.fixtures.reconciling import new_reconciler
from tests.fixtures.sandbox import books, create_at_sandbox

pytestmark = pytest.mark.postgres
CALLS = 1000


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(reconcile_capability("refund", sandbox.url))


async def test_two_reconcilers_over_1000_calls_settle_each_exactly_once(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
) -> None:
    keys = [f"k-{i}" for i in range(CALLS)]
    # Half were answered with a provider id before the response was lost, half not:
    # both lookups (by id and by key) are exercised.
    external = await create_at_sandbox(sandbox.url, keys)
    ids = await insert_unknown_calls(
        sessions, keys, "refund", external_ids={k: external[k] for k in keys[::2]}
    )
    async with Transport(64) as a, Transport(64) as b:
        reconcilers = [
            new_reconciler(sessions, registry, a, batch_size=50),
            new_reconciler(sessions, registry, b, batch_size=50),
        ]
        tally = await until_neither_finds_anything(sessions, reconcilers)

    # A lookup that timed out on a loaded machine is a retry_later, looked at again in a
    # later pass; a call worked by both at once would show up as taken_over.
    assert tally.counts["confirmed_success"] == CALLS
    assert set(tally.counts) <= {"confirmed_success", "retry_later"}, tally.counts
    async with sessions() as session:
        events = Counter(
            r.tool_call_id
            for r in await session.execute(
                select(execution_events.c.tool_call_id).where(
                    execution_events.c.event_type == "tool.call.confirmed"
                )
            )
        )
        statuses = Counter(r.status for r in await session.execute(select(tool_calls.c.status)))
        producers = Counter(
            r.payload["decision"]
            for r in await session.execute(
                select(execution_events.c.payload).where(
                    execution_events.c.event_type == "tool.call.confirmed"
                )
            )
        )
    assert events == dict.fromkeys(ids, 1)
    assert statuses == {"confirmed": CALLS}
    assert producers == {"confirm_success": CALLS}
    assert (await books(sandbox.url))["effects"] == dict.fromkeys(keys, 1)


async def until_neither_finds_anything(
    sessions: async_sessionmaker[AsyncSession], reconcilers: list[Reconciler], passes: int = 20
) -> Tally:
    """Overlapping passes of every reconciler until one does nothing (backoffs made due
    at once)."""
    tally = Tally()
    for _ in range(passes):
        one = await reconcile_once(reconcilers)
        tally.merge(one)
        if one.total == 0:
            return tally
        await make_due(sessions)
    raise AssertionError(f"still not settled after {passes} passes: {tally.counts}")
