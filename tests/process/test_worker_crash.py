"""kill -9 of a real worker process at each crash point, then a fresh worker: the
three-way rule decides what happens to the call (real PostgreSQL, broker, sandbox)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.sandbox import SandboxServer
from dispatcher.capabilities import load_registry
from tests.fixtures.calls import submit_call
from tests.fixtures.rows import call_row, event_types
from tests.fixtures.sandbox import at_provider, books
from tests.fixtures.stack import MakeStack, exited
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]


CASES = [
    # crash point, capability, status right after the kill, final status, requests received
    ("after-claim", "refund", "dispatching", "result_unknown", 0),
    ("after-claim", "lookup", "dispatching", "completed", 1),
    ("after-send", "refund", "dispatching", "result_unknown", 1),
    ("after-send", "lookup", "dispatching", "completed", 2),
    ("after-record", "refund", "completed", "completed", 1),
    ("after-record", "lookup", "completed", "completed", 1),
]


@pytest.mark.parametrize(
    ("point", "cap", "at_crash", "final", "received"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES]
)
async def test_kill_at_crash_point_then_recover(
    point: str,
    cap: str,
    at_crash: str,
    final: str,
    received: int,
    make_stack: MakeStack,
    sessions: async_sessionmaker[AsyncSession],
    sandbox: SandboxServer,
) -> None:
    stack = make_stack(
        sandbox_url=sandbox.url,
        # A request timeout no loaded machine comes near: a timed-out first attempt of the
        # read-only capability would be re-sent before the crash point and count twice.
        # The lease this gives (5 s x 2 attempts + backoff + margin, ~10.6 s) is what the
        # survivor waits out before recovering a call left dispatching; well inside
        # `eventually`'s bound.
        capability={"timeout": 5.0, "attempts": 2},
    )
    registry = load_registry(Path(stack.env["TOOL_DISPATCHER_CAPABILITIES_FILE"]))
    stack.start("relay")
    doomed = stack.start("worker", name="doomed", crash_at=f"{point}:1")
    call = await submit_call(
        sessions, registry, cap, {"orderId": "o-1"}, key=f"key-{cap}", topics=stack.topics
    )

    assert await exited(doomed) == -signal.SIGKILL
    assert (await call_row(sessions, call))["status"] == at_crash
    if point != "after-claim":
        assert (await books(sandbox.url))["received"] == {at_provider(f"key-{cap}"): 1}

    stack.start("worker", name="survivor")

    async def settled() -> bool:
        return bool((await call_row(sessions, call))["status"] == final)

    await eventually(settled, what=f"{call} to become {final}")
    counts = await books(sandbox.url)
    assert counts["received"].get(at_provider(f"key-{cap}"), 0) == received
    assert counts["effects"].get(at_provider(f"key-{cap}"), 0) <= 1
    if cap == "refund" and point != "after-claim":
        assert counts["effects"] == {at_provider(f"key-{cap}"): 1}  # the lost answer had its effect
    events = await event_types(sessions, call)
    if final == "result_unknown":
        assert events[-1] == "tool.call.result_unknown"
        assert (await call_row(sessions, call))["reconciliation_status"] == "pending"
    assert events.count("tool.call.completed") == (1 if final == "completed" else 0)
