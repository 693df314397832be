"""The lines written while a worker sends a call carry that call's ``tool_call_id``,
``run_id`` and ``capability_id``: each call's own, though a batch's calls are in flight
together (real PostgreSQL, the real sandbox; a provider client that logs a line before
it sends). tests/reconciler/test_log_context.py has the reconciler's."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.worker.executor import Executor
from tests.fixtures.calls import submit_call
from tests.fixtures.capabilities import reconcile_capability
from tests.fixtures.log_lines import LoggingProvider, ids_of, json_lines

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        reconcile_capability("refund", sandbox.url), reconcile_capability("lookup", sandbox.url)
    )


async def test_a_batch_s_sends_each_carry_their_call(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport
) -> None:
    calls = {
        await submit_call(sessions, registry, cap, {"n": n}, key=f"ctx:{n}", run_id=f"run-{n}"): (
            f"run-{n}",
            cap,
        )
        for n, cap in enumerate(["refund", "lookup", "refund"])
    }
    executor = Executor(
        sessions, registry, LoggingProvider(http), worker_id="w-ctx", topics=DEFAULT_TOPICS
    )

    with json_lines("tests.spy") as lines:
        await executor.execute_many([("acme", call) for call in calls])

    assert len(lines) == 3
    for line in lines:
        call = line["message"].removeprefix("sending ")
        assert ids_of(line) == (call, *calls[call])
