"""Two tenants' calls with one toolCallId, end to end: real relay and worker processes
on a real broker, the sandbox provider; each call runs once, with an effect of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry, load_registry
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.intake.service import submit
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from dispatcher.worker.redrive import redrive_stale
from tests.fixtures.sandbox import at_provider, books
from tests.fixtures.stack import MakeStack
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres

TENANTS = ("acme", "globex")
Sessions = async_sessionmaker[AsyncSession]


async def submit_shared(
    sessions: Sessions, registry: CapabilityRegistry, topics: Topics = DEFAULT_TOPICS
) -> None:
    """Each tenant's ``shared-1``, with an input of its own and no key."""
    for tenant in TENANTS:
        async with sessions() as session, session.begin():
            await submit(
                session,
                SubmitRequest(
                    run_id="run-1",
                    capability_id="refund",
                    tool_call_id="shared-1",
                    input={"orderId": f"o-{tenant}"},
                ),
                tenant=tenant,
                registry=registry,
                topics=topics,
            )


async def shared_rows(sessions: Sessions) -> dict[str, dict[str, object]]:
    async with sessions() as session:
        found = await session.execute(
            select(tool_calls).where(tool_calls.c.tool_call_id == "shared-1")
        )
        return {r.tenant: dict(r._mapping) for r in found}


async def test_one_worker_batch_runs_each_tenants_call_with_its_own_outcome(
    sessions: Sessions, sandbox: SandboxServer
) -> None:
    registry = registry_of(capability("refund", sandbox.url))
    await submit_shared(sessions, registry)
    async with Transport() as http:
        worker = Executor(
            sessions, registry, ProviderClient(http), worker_id="w", topics=DEFAULT_TOPICS
        )
        statuses = await worker.execute_many([(t, "shared-1") for t in TENANTS])

    assert statuses == {(t, "shared-1"): S.COMPLETED for t in TENANTS}
    calls = await shared_rows(sessions)
    for tenant in TENANTS:
        # Each row holds the answer to its own request (the sandbox echoes the input).
        assert calls[tenant]["result"]["echo"] == {"orderId": f"o-{tenant}"}  # type: ignore[index]
    assert (await books(sandbox.url))["effects"] == {
        at_provider(f"{t}:shared-1", t): 1 for t in TENANTS
    }


@pytest.mark.kafka
async def test_same_tool_call_id_in_two_tenants_runs_twice_with_one_effect_each(
    make_stack: MakeStack, sessions: Sessions, sandbox: SandboxServer
) -> None:
    stack = make_stack(sandbox_url=sandbox.url)
    registry = load_registry(Path(stack.env["TOOL_DISPATCHER_CAPABILITIES_FILE"]))
    await submit_shared(sessions, registry, Topics(**stack.topics))
    stack.start("relay")
    stack.start("worker")

    async def both_completed() -> bool:
        calls = await shared_rows(sessions)
        return len(calls) == 2 and all(c["status"] == "completed" for c in calls.values())

    await eventually(both_completed, what="both tenants' shared-1 to complete")
    calls = await shared_rows(sessions)
    assert {t: c["idempotency_key"] for t, c in calls.items()} == {
        t: f"{t}:shared-1" for t in TENANTS
    }
    assert calls["acme"]["external_request_id"] != calls["globex"]["external_request_id"]
    assert calls["acme"]["dispatch_attempts"] == calls["globex"]["dispatch_attempts"] == 1
    assert (await books(sandbox.url))["effects"] == {
        at_provider(f"{t}:shared-1", t): 1 for t in TENANTS
    }


async def test_redrive_tells_two_tenants_commands_apart(
    sessions: Sessions, sandbox: SandboxServer
) -> None:
    """Both tenants' commands are about ``shared-1`` (each keyed by its own tenant's
    ordering key): acme's command still waiting must not pass for globex's lost one."""
    await submit_shared(sessions, registry_of(capability("refund", sandbox.url)))
    back = text("now() - interval '120 seconds'")
    async with sessions() as session, session.begin():
        await session.execute(update(tool_calls).values(updated_at=back, created_at=back))
        # Globex's command was published long ago and lost; acme's is still waiting.
        await session.execute(
            update(outbox)
            .where(outbox.c.payload["tenant"].astext == "globex")
            .values(published_at=back, created_at=back)
        )

    redriven = await redrive_stale(sessions, topics=DEFAULT_TOPICS, older_than_seconds=60)

    assert redriven == ["shared-1"]
    async with sessions() as session:
        events = await session.execute(
            select(execution_events.c.tenant).where(
                execution_events.c.event_type == "tool.call.redriven"
            )
        )
        assert events.scalars().all() == ["globex"]
