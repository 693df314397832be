"""A key derived from a template over non-ASCII input reaches the provider: the worker
sends it percent-encoded, and the call completes."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from tests.fixtures.calls import submit_call
from tests.fixtures.rows import call_row
from tests.fixtures.sandbox import at_provider, books

pytestmark = pytest.mark.postgres


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        capability("refund", sandbox.url, idempotencyKeyTemplate="refund:{input.orderId}")
    )


async def test_a_non_ascii_template_value_is_sent_percent_encoded(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await submit_call(sessions, registry, "refund", {"orderId": "ключ"})
    executor = Executor(
        sessions, registry, ProviderClient(http), worker_id="worker-a", topics=DEFAULT_TOPICS
    )

    assert await executor.execute(call, "acme") is S.COMPLETED

    key = "refund:%D0%BA%D0%BB%D1%8E%D1%87"
    row = await call_row(sessions, call)
    assert (row["idempotency_key"], row["status"]) == (key, "completed")
    assert (await books(sandbox.url))["effects"] == {at_provider(key): 1}
