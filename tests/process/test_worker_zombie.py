"""A worker paused with SIGSTOP past its lease, woken with SIGCONT after the call was
taken over, must not be able to record anything (real processes)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.sandbox import SandboxServer
from dispatcher.capabilities import load_registry
from tests.fixtures.calls import submit_call
from tests.fixtures.rows import call_row, event_types
from tests.fixtures.sandbox import add_fault, at_provider, books
from tests.fixtures.stack import MakeStack
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]


async def test_stalled_worker_wakes_up_fenced_out(
    make_stack: MakeStack,
    sessions: async_sessionmaker[AsyncSession],
    sandbox: SandboxServer,
) -> None:
    # Lease = 2 s timeout x 1 attempt + 0.5 s margin; the worker never sweeps itself.
    stack = make_stack(
        sandbox_url=sandbox.url,
        capability={"timeout": 2.0, "attempts": 1},
        recovery_interval_seconds=3600,
    )
    registry = load_registry(Path(stack.env["TOOL_DISPATCHER_CAPABILITIES_FILE"]))
    # The provider takes its time, so the worker is caught with the request in flight.
    await add_fault(
        sandbox.url, {"kind": "latency", "latencyMs": 800, "idempotencyKey": at_provider("z-1")}
    )
    stack.start("relay")
    zombie = stack.start("worker", name="zombie")
    call = await submit_call(
        sessions, registry, "refund", {"orderId": "o-1"}, key="z-1", topics=stack.topics
    )

    async def in_flight() -> bool:
        return (await books(sandbox.url))["received"].get(at_provider("z-1"), 0) == 1

    await eventually(in_flight, what="the request to reach the provider")
    os.killpg(zombie.pid, signal.SIGSTOP)
    claimed = await call_row(sessions, call)
    assert claimed["status"] == "dispatching"
    assert claimed["lease_owner"] is not None

    await asyncio.sleep(3.0)  # past the 2.5 s lease, and the provider has answered
    swept = await asyncio.to_thread(stack.run, "recover", "--once")
    assert swept.returncode == 0, swept.stderr
    assert "1 marked result_unknown" in swept.stdout
    taken_over = await event_types(sessions, call)

    os.killpg(zombie.pid, signal.SIGCONT)

    async def fenced() -> bool:
        return bool("lease lost" in stack.log_of(zombie))

    await eventually(fenced, what="the zombie to report its lost lease")
    row = await call_row(sessions, call)
    assert row["status"] == "result_unknown"
    assert row["external_request_id"] is None  # nothing of what the zombie saw
    assert await event_types(sessions, call) == taken_over
    assert (await books(sandbox.url))["effects"] == {at_provider("z-1"): 1}
    assert zombie.poll() is None  # it carries on serving other calls
