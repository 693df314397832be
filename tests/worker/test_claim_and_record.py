"""The executor's single-call and batch API, point A and point B, as their callers rely
on them: a claim of a call that is not ``authorized`` is None, a recorded outcome is
returned and written, the crash points are passed in order, a follow-up is scheduled
after the capability's delay, every row goes to the configured topics, and an error the
provider client does not know leaves the call in doubt."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.errors import TransitionConflict
from dispatcher.ledger.messages import Producer
from dispatcher.provider.client import OutcomeKind, ProviderClient, ProviderOutcome
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.claims import claim_calls
from dispatcher.worker.crashpoints import CrashPoints
from dispatcher.worker.executor import Executor
from dispatcher.worker.recovery import recover_expired
from tests.fixtures.calls import expire_leases, submit_call
from tests.fixtures.rows import call_row, event_types, events_of, outbox_rows

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
TOPICS = Topics(dispatch="site.commands", events="site.events", escalations="site.escalations")
DELAY = 40.0


class _Passed(CrashPoints):
    """Crash points that note each label passed instead of killing the process."""

    def __init__(self) -> None:
        super().__init__()
        self.labels: list[str] = []

    def hit(self, label: str) -> None:
        self.labels.append(label)


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        capability("refund", sandbox.url, reconcile={"initialDelaySeconds": DELAY}),
        capability("lookup", sandbox.url, side_effects=False),
    )


@pytest.fixture
async def executor(sessions: Sessions, registry: CapabilityRegistry) -> AsyncIterator[Executor]:
    async with Transport() as http:
        yield Executor(
            sessions, registry, ProviderClient(http), worker_id="worker-a", topics=TOPICS
        )


async def test_a_claim_of_a_call_already_claimed_is_none(
    sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="k-twice")
    assert await executor.claim(call, "acme") is not None
    assert await executor.claim(call, "acme") is None
    async with sessions() as session, session.begin():
        nothing = await claim_calls(
            session,
            [],
            capabilities={},
            leases={},
            owner="w",
            producer=Producer.WORKER,
            topics=TOPICS,
        )
    assert nothing == []


async def test_record_returns_and_writes_the_outcome_of_a_live_claim(
    sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="k-record")
    claim = await executor.claim(call, "acme")
    assert claim is not None
    answer = ProviderOutcome(OutcomeKind.COMPLETED, 1, 200, "req_1", {"ok": True})

    assert await executor.record(claim, answer) is S.COMPLETED

    row = await call_row(sessions, call)
    assert (row["status"], row["result"], row["external_request_id"]) == (
        "completed",
        {"ok": True},
        "req_1",
    )


async def test_an_unknown_outcome_is_looked_at_after_the_capabilitys_initial_delay(
    sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="k-follow")
    claim = await executor.claim(call, "acme")
    assert claim is not None
    lost = ProviderOutcome(OutcomeKind.UNKNOWN, 1, error="sent, no answer: ReadTimeout")

    assert await executor.record(claim, lost) is S.RESULT_UNKNOWN

    row = await call_row(sessions, call)
    # Both set by the recording transaction's now().
    assert row["next_reconcile_at"] - row["updated_at"] == timedelta(seconds=DELAY)


async def test_a_batch_passes_its_crash_points_in_order_and_writes_to_its_topics(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer
) -> None:
    call = await submit_call(
        sessions, registry, "refund", {"n": 1}, key="k-crash", topics=dataclasses.asdict(TOPICS)
    )
    crash = _Passed()
    async with Transport() as http:
        executor = Executor(
            sessions,
            registry,
            ProviderClient(http),
            worker_id="worker-a",
            topics=TOPICS,
            crash=crash,
        )
        assert await executor.execute(call, "acme") is S.COMPLETED

    assert crash.labels == ["after-claim", "after-send", "after-record"]
    # Every published event of the call, to its last, on the site's topic (the claim's
    # is in the log only: tests below).
    published = [r["payload"]["eventType"] for r in await outbox_rows(sessions, TOPICS.events)]
    assert published[-2:] == ["tool.call.authorized", "tool.call.completed"]
    assert await outbox_rows(sessions, DEFAULT_TOPICS.events) == []


async def _log_and_messages(sessions: Sessions, call: str) -> tuple[dict[str, str], set[str]]:
    """The call's events in its log (event type to id; one event of each type here), and
    the event ids of the messages in the outbox's events topic."""
    logged = {e["event_type"]: e["event_id"] for e in await events_of(sessions, call)}
    messages = {r["headers"]["ce_id"] for r in await outbox_rows(sessions, TOPICS.events)}
    return logged, messages


async def test_a_claim_is_in_the_log_but_not_on_the_bus_and_its_outcome_is_in_both(
    sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    """The claim's ``tool.call.dispatching`` is the worker's bookkeeping: the log (the
    API's events, the console, the run view) keeps it; consumers get the outcome."""
    call = await submit_call(
        sessions, registry, "refund", {"n": 1}, key="k-log-only", topics=dataclasses.asdict(TOPICS)
    )
    claim = await executor.claim(call, "acme")
    assert claim is not None
    logged, messages = await _log_and_messages(sessions, call)
    assert "tool.call.dispatching" in logged
    assert logged["tool.call.dispatching"] not in messages
    assert logged["tool.call.authorized"] in messages

    assert await executor.run(claim) is S.COMPLETED
    logged, messages = await _log_and_messages(sessions, call)
    assert list(logged) == [
        "tool.call.requested",
        "tool.call.authorized",
        "tool.call.dispatching",
        "tool.call.completed",
    ]
    assert logged["tool.call.dispatching"] not in messages
    assert logged["tool.call.completed"] in messages
    published = {r["headers"]["ce_type"] for r in await outbox_rows(sessions, TOPICS.events)}
    assert "tool.call.dispatching" not in published


async def test_a_batch_claim_writes_every_claim_to_the_log_and_none_to_the_outbox(
    sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    calls = [
        await submit_call(
            sessions,
            registry,
            "refund",
            {"n": i},
            key=f"k-batch-log-{i}",
            topics=dataclasses.asdict(TOPICS),
        )
        for i in range(3)
    ]
    before = len(await outbox_rows(sessions, TOPICS.events))

    claims = await executor.claim_many([("acme", call) for call in calls])

    assert len(claims) == 3
    for call in calls:
        assert (await event_types(sessions, call))[-1] == "tool.call.dispatching"
    # Not one message for the three claims.
    assert len(await outbox_rows(sessions, TOPICS.events)) == before
    assert set((await executor.run_many(claims)).values()) == {S.COMPLETED}
    after = await outbox_rows(sessions, TOPICS.events)
    assert [r["headers"]["ce_type"] for r in after[before:]] == ["tool.call.completed"] * 3


async def test_claim_in_refuses_with_the_call_and_target_named_and_does_not_settle(
    sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="k-claim-in")
    refund = registry.get("refund")
    async with sessions() as session, session.begin():
        claim = await executor.claim_in(
            session, call, refund, tenant="acme", expected=S.AUTHORIZED, dispatch_attempts=0
        )
    # Not a re-send: a final answer completes the call, it does not settle it.
    assert not claim.settles
    async with sessions() as session, session.begin():
        with pytest.raises(TransitionConflict) as refused:
            await executor.claim_in(
                session, call, refund, tenant="acme", expected=S.AUTHORIZED, dispatch_attempts=0
            )
    assert refused.value.detail == (
        f"tool call {call!r} is no longer authorized (or its lease/version changed)"
    )
    assert refused.value.extra == {"toolCallId": call, "target": "dispatching"}
    assert await executor.run(claim) is S.COMPLETED


async def test_a_fresh_claim_of_a_call_dispatched_before_takes_a_new_dispatch_time(
    sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    """A read-only call re-dispatched by the recovery sweep: only a re-send keeps the
    first dispatch time; a new claim is a new dispatch."""
    call = await submit_call(sessions, registry, "lookup", {"n": 1}, key="k-again")
    assert await executor.claim(call, "acme") is not None
    first = (await call_row(sessions, call))["dispatched_at"]
    await expire_leases(sessions)
    assert (await recover_expired(sessions, registry, topics=TOPICS)).redispatched == [call]

    assert await executor.claim(call, "acme") is not None

    assert (await call_row(sessions, call))["dispatched_at"] > first
    assert (await event_types(sessions, call)).count("tool.call.dispatching") == 2


async def test_an_error_the_client_does_not_know_leaves_the_call_in_doubt(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    """The transport refuses to send once closed, with a RuntimeError, which the
    provider client does not classify: nothing proves the request never left."""
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="k-closed")
    async with Transport() as http:
        pass
    executor = Executor(
        sessions, registry, ProviderClient(http), worker_id="worker-a", topics=TOPICS
    )

    assert await executor.execute(call, "acme") is S.RESULT_UNKNOWN

    row = await call_row(sessions, call)
    assert (row["last_error"], row["verification_status"]) == (
        "send failed: RuntimeError",
        "pending",
    )
    unknown = (await events_of(sessions, call))[-1]
    assert unknown["event_type"] == "tool.call.result_unknown"
    assert (unknown["payload"]["attempts"], unknown["payload"]["error"]) == (
        1,
        "send failed: RuntimeError",
    )
