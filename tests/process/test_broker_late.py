"""A worker and a relay started before the broker is up wait for it instead of exiting,
create the service's topics, and then carry a call that was submitted meanwhile
through to the provider (real processes, a real broker that appears late)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.embedded import Tansu, free_port
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import load_registry
from tests.fixtures.calls import submit_call
from tests.fixtures.rows import call_row
from tests.fixtures.sandbox import at_provider, books
from tests.fixtures.stack import MakeStack
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]

HOST = "127.0.0.1"


@pytest.fixture
def port() -> int:
    return free_port(HOST)


async def test_worker_and_relay_wait_for_a_broker_that_is_not_up_yet(
    make_stack: MakeStack,
    port: int,
    sessions: async_sessionmaker[AsyncSession],
    sandbox: SandboxServer,
) -> None:
    stack = make_stack(sandbox_url=sandbox.url, kafka_bootstrap=f"{HOST}:{port}")
    relay, worker = stack.start("relay"), stack.start("worker")

    def waiting(process: subprocess.Popen[bytes]) -> bool:
        return stack.log_of(process).count("not reachable") >= 2

    async def both_waiting() -> bool:
        exited = relay.poll() is not None or worker.poll() is not None
        return exited or (waiting(relay) and waiting(worker))

    await eventually(both_waiting, what="the relay and the worker to wait for the broker")
    assert relay.poll() is None, stack.log_of(relay)
    assert worker.poll() is None, stack.log_of(worker)

    registry = load_registry(Path(stack.env["TOOL_DISPATCHER_CAPABILITIES_FILE"]))
    call = await submit_call(
        sessions, registry, "refund", {"orderId": "o-1"}, key="late-1", topics=stack.topics
    )
    broker = Tansu(host=HOST, port=port)
    broker.start()
    try:

        async def completed() -> bool:
            exited = relay.poll() is not None or worker.poll() is not None
            return exited or (await call_row(sessions, call))["status"] == "completed"

        await eventually(completed, what="the call to be carried through once the broker is up")
        assert relay.poll() is None, stack.log_of(relay)
        assert worker.poll() is None, stack.log_of(worker)
        # Nothing was dead-lettered for a missing topic: the relay created the topics.
        assert "dead-lettered" not in stack.log_of(relay)
        assert (await books(sandbox.url))["effects"] == {at_provider("late-1"): 1}
    finally:
        stack.close()
        broker.stop()
