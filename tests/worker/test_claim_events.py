"""A batch claim's ``tool.call.dispatching`` events are written by the claim's own
statement, built in SQL from the moved rows: each is the event Python would have built
(:func:`dispatcher.ledger.events.event_row`), but for its id and time, and the worker's
transition lines say the same (counted as psycopg executes them, on a real PostgreSQL)."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.ledger.events import CallContext, EventType, event_row
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import BulkMove, move_many
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from tests.fixtures.calls import submit_call
from tests.fixtures.rows import call_row, events_of
from tests.fixtures.statements import statements

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
# Whole seconds, longer than the capability's worst case: the payload keeps the float's
# form (30.0), as Python's JSON writes it, not float8's (30).
LEASE = 30.0


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(capability("refund", sandbox.url))


@pytest.fixture
async def executor(sessions: Sessions, registry: CapabilityRegistry) -> AsyncIterator[Executor]:
    async with Transport() as http:
        yield Executor(
            sessions,
            registry,
            ProviderClient(http),
            worker_id="worker-a",
            topics=DEFAULT_TOPICS,
            min_lease_seconds=LEASE,
        )


async def test_a_batch_claim_writes_each_event_in_its_statement_as_python_would(
    engine: AsyncEngine,
    sessions: Sessions,
    registry: CapabilityRegistry,
    executor: Executor,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = [
        await submit_call(sessions, registry, "refund", {"n": i}, key=f"k-{i}") for i in range(3)
    ]
    started = datetime.now(UTC)
    with (
        statements(engine) as sent,
        caplog.at_level(logging.INFO, logger="tool_dispatcher.transitions"),
    ):
        claims = await executor.claim_many([("acme", call) for call in calls])
    assert len(claims) == 3

    # One round trip: the UPDATE and its events, no second INSERT.
    (claiming,) = [s for s in sent if "execution_events" in s]
    assert "UPDATE tool_calls" in claiming and "INSERT INTO execution_events" in claiming
    assert sum("tool_calls" in s for s in sent) == 1
    for claim in claims:
        stored = (await events_of(sessions, claim.tool_call_id))[-1]
        expected = event_row(
            EventType.TOOL_CALL_DISPATCHING,
            CallContext.of(await call_row(sessions, claim.tool_call_id)),
            producer=Producer.WORKER,
            payload={
                "from": ["authorized"],
                "to": "dispatching",
                "worker": "worker-a",
                "claimVersion": claim.version,
                "leaseSeconds": claim.lease_seconds,
            },
        )
        assert {k: v for k, v in stored.items() if k not in ("seq", "event_id", "occurred_at")} == {
            k: v for k, v in expected.items() if k not in ("event_id", "occurred_at")
        }
        assert claim.lease_seconds == LEASE
        assert isinstance(stored["payload"]["leaseSeconds"], float)
        assert re.fullmatch(r"evt_[0-9a-f]{32}", stored["event_id"])
        assert started <= stored["occurred_at"] <= datetime.now(UTC)
        (line,) = [
            r for r in caplog.records if getattr(r, "tool_call_id", None) == claim.tool_call_id
        ]
        assert (line.__dict__["from"], line.__dict__["to"]) == ("authorized", "dispatching")
    assert len({(await events_of(sessions, c.tool_call_id))[-1]["event_id"] for c in claims}) == 3


async def test_events_written_in_sql_take_no_payload_from_their_moves(sessions: Sessions) -> None:
    """A move's own payload would be lost in SQL: refused before anything is sent."""
    async with sessions() as session, session.begin():
        with pytest.raises(ValueError, match="no payload"):
            await move_many(
                session,
                [BulkMove("tc-1", None, {}, {"why": "x"}, tenant="acme")],
                expected=S.AUTHORIZED,
                target=S.DISPATCHING,
                event_type=EventType.TOOL_CALL_DISPATCHING,
                producer=Producer.WORKER,
                lease_owner=None,
                payload_sql=lambda moved: {"claimVersion": moved.c.version},
            )
