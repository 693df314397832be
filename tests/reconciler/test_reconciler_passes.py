"""The reconciler's re-sends and passes against the real sandbox and real PostgreSQL: a
re-send counted in its event and fenced by the claim, a call of an unregistered
capability escalated without lookups, overlapping passes adding up every reconciler's
settlements, and the loop settling pass after pass until stopped, its gauges read
beside the passes."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.provider.transport import Transport
from reconciler import metrics
from reconciler.due import claim_due
from reconciler.loop import GAUGES_LOOP, reconcile_once
from tests.fixtures.calls import insert_unknown_calls, unknown_call
from tests.fixtures.capabilities import reconcile_capability
from tests.fixtures.metrics import sample
from tests.fixtures.reconciling import new_reconciler, until_settled
from tests.fixtures.rows import call_row, escalation_rows, events_of
from tests.fixtures.sandbox import books, create_at_sandbox

pytestmark = pytest.mark.postgres


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(reconcile_capability("refund", sandbox.url, reconcile={"maxAttempts": 3}))


async def test_a_re_send_is_counted_in_its_event(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await unknown_call(
        sessions, registry, http, sandbox.url, "refund", "k-resend", {"kind": "drop_before_apply"}
    )
    tally = await until_settled(new_reconciler(sessions, registry, http))

    assert tally.counts == {"redispatched": 1}
    (sent,) = [
        e["payload"]
        for e in await events_of(sessions, call)
        if e["event_type"] == "tool.call.redispatched"
    ]
    assert (sent["redispatch"], sent["decision"]) == (1, "redispatch")


@pytest.mark.parametrize("taken_over", ["by_owner", "by_version"])
async def test_a_re_send_under_a_lost_claim_sends_nothing(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
    taken_over: str,
) -> None:
    call_id = await unknown_call(
        sessions, registry, http, sandbox.url, "refund", "k-lost", {"kind": "drop_before_apply"}
    )
    reconciler = new_reconciler(sessions, registry, http)
    owner = "rec-other" if taken_over == "by_owner" else reconciler.owner
    async with sessions() as session, session.begin():
        (call,) = await claim_due(session, owner=owner, limit=1, lease_seconds=60)
    if taken_over == "by_version":
        call = dataclasses.replace(call, version=call.version - 1)
    before = await books(sandbox.url)

    assert await reconciler._redispatch(call, registry.get("refund"), {}) is False

    assert await books(sandbox.url) == before
    assert (await call_row(sessions, call_id))["dispatch_attempts"] == 1


async def test_a_call_of_an_unregistered_capability_is_escalated_without_lookups(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    http: Transport,
) -> None:
    (call,) = await insert_unknown_calls(sessions, ["k-gone"], "retired-capability")

    tally = await new_reconciler(sessions, registry, http).run_pass()

    assert tally.counts == {"escalated": 1}
    (escalation,) = await escalation_rows(sessions)
    assert escalation["tool_call_id"] == call
    assert escalation["reason"] == "capability 'retired-capability' not registered"
    assert (escalation["evidence"]["providerLookup"], escalation["evidence"]["policy"]) == (
        [],
        None,
    )


async def test_overlapping_passes_add_up_every_reconcilers_settlements(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    keys = ["k-o1", "k-o2", "k-o3"]
    await create_at_sandbox(sandbox.url, keys)
    await insert_unknown_calls(sessions, keys, "refund")
    both = [new_reconciler(sessions, registry, http, batch_size=1) for _ in range(2)]

    tally = await reconcile_once(both)

    assert tally.counts == {"confirmed_success": 3}


async def test_the_loop_settles_pass_after_pass_until_stopped(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await create_at_sandbox(sandbox.url, ["k-first", "k-later"])
    (first,) = await insert_unknown_calls(sessions, ["k-first"], "refund")
    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="reconciler.loop")
    loop = asyncio.create_task(new_reconciler(sessions, registry, http).run(stop, 0.05))

    await confirmed(sessions, first)
    # Only once the first pass has ended: the fixture's rows are due a second ago, so one
    # inserted while that pass's other lane still claims would be in the first pass.
    await pass_logged(caplog)
    # Found by a later pass, once the loop has waited out its interval.
    (later,) = await insert_unknown_calls(sessions, ["k-later"], "refund")
    await confirmed(sessions, later)
    stop.set()
    await asyncio.wait_for(loop, 5)

    loop_logs = [r for r in caplog.records if r.name == "reconciler.loop"]
    assert not [r.getMessage() for r in loop_logs if r.levelno >= logging.ERROR]
    passes = [m for r in loop_logs if (m := r.getMessage()).startswith("reconcile pass:")]
    assert [p.split(", ")[0] for p in passes] == ["reconcile pass: confirmed_success: 1"] * 2


async def pass_logged(caplog: pytest.LogCaptureFixture) -> None:
    for _ in range(500):
        if any(r.getMessage().startswith("reconcile pass:") for r in caplog.records):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the first pass never ended")


async def confirmed(sessions: async_sessionmaker[AsyncSession], call: str) -> None:
    for _ in range(500):
        if (await call_row(sessions, call))["status"] == "confirmed":
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{call} was never confirmed")


async def test_a_stuck_gauge_read_holds_no_pass_back(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gauges are refreshed in a loop of their own (``reconciler_gauges``): while
    their read hangs, passes go on settling calls; once it returns, its step is timed
    under its own loop name."""
    released = asyncio.Event()
    reads = 0

    async def stuck_refresh(_: object) -> None:
        nonlocal reads
        reads += 1
        await released.wait()

    monkeypatch.setattr(metrics, "refresh", stuck_refresh)
    gauge_steps = sample("loop_step_seconds_count", loop=GAUGES_LOOP)
    await create_at_sandbox(sandbox.url, ["k-g1", "k-g2"])
    (first,) = await insert_unknown_calls(sessions, ["k-g1"], "refund")
    stop = asyncio.Event()
    loop = asyncio.create_task(new_reconciler(sessions, registry, http).run(stop, 0.05))

    await confirmed(sessions, first)
    (later,) = await insert_unknown_calls(sessions, ["k-g2"], "refund")
    await confirmed(sessions, later)  # a later pass, the gauge read still hanging
    assert reads == 1
    released.set()
    stop.set()
    await asyncio.wait_for(loop, 5)
    assert sample("loop_step_seconds_count", loop=GAUGES_LOOP) == gauge_steps + 1
