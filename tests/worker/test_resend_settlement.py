"""A re-send of a call in doubt, claimed and recorded the way the reconciler does it
(``Executor.claim_in(..., settles=True)``): its final answer settles the call, its
first dispatch time stands, an answer that is not final leaves it in doubt (or
accepted), its settlement goes to the configured topics, and a fence it no longer holds
refuses the claim."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import tool_calls
from dispatcher.errors import TransitionConflict
from dispatcher.ledger.events import EventType
from dispatcher.ledger.transitions import Fence
from dispatcher.provider.client import OutcomeKind, ProviderClient, ProviderOutcome
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from tests.fixtures.calls import unknown_call
from tests.fixtures.rows import call_row, events_of, outbox_rows

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
OWNER = "reconciler-1"


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(capability("refund", sandbox.url))


@pytest.fixture
async def executor(sessions: Sessions, registry: CapabilityRegistry) -> AsyncIterator[Executor]:
    async with Transport() as http:
        yield Executor(
            sessions, registry, ProviderClient(http), worker_id=OWNER, topics=DEFAULT_TOPICS
        )


async def in_doubt(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer, key: str
) -> tuple[str, int]:
    """A call lost before the provider applied it, first sent a minute ago and taken by
    the reconciler (its lease and a bumped version); returns it and that version."""
    async with Transport() as http:
        call = await unknown_call(
            sessions, registry, http, sandbox.url, "refund", key, {"kind": "drop_before_apply"}
        )
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls)
            .where(tool_calls.c.tool_call_id == call)
            .values(
                lease_owner=OWNER,
                version=tool_calls.c.version + 1,
                dispatched_at=text("now() - interval '60 seconds'"),
            )
        )
    return call, (await call_row(sessions, call))["version"]


async def resend(
    executor: Executor, sessions: Sessions, registry: CapabilityRegistry, call: str, fence: Fence
) -> S | None:
    async with sessions() as session, session.begin():
        claim = await executor.claim_in(
            session,
            call,
            registry.get("refund"),
            tenant="acme",
            expected=S.RESULT_UNKNOWN,
            dispatch_attempts=1,
            event_type=EventType.TOOL_CALL_REDISPATCHED,
            payload={"redispatch": 1},
            fence=fence,
            settles=True,
        )
    assert claim.settles and claim.version == fence.version + 1  # type: ignore[operator]
    return await executor.run(claim)


async def test_a_final_answer_to_a_resend_settles_the_call(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer, executor: Executor
) -> None:
    call, version = await in_doubt(sessions, registry, sandbox, "k-resend")
    first_sent = (await call_row(sessions, call))["dispatched_at"]

    assert await resend(executor, sessions, registry, call, Fence(OWNER, version)) is S.CONFIRMED

    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"], row["reconciliation_status"]) == (
        "confirmed",
        "confirmed_success",
        "settled",
    )
    assert row["result"] == {"echo": {"n": 1}}
    assert row["last_error"] is None
    assert row["completed_at"] is not None and row["next_reconcile_at"] is None
    assert row["dispatch_attempts"] == 2 and row["lease_owner"] is None
    # The provider's idempotency window counts from the first send, not this one.
    assert row["dispatched_at"] == first_sent
    events = await events_of(sessions, call)
    assert [e["event_type"] for e in events[-3:]] == [
        "tool.call.redispatched",
        "tool.call.accepted",
        "tool.call.confirmed",
    ]
    assert events[-3]["payload"]["redispatch"] == 1
    confirmed = events[-1]["payload"]
    # No error: a field without a value is left out of the event.
    assert (confirmed["httpStatus"], "error" in confirmed) == (200, False)
    assert confirmed["externalRequestId"] == row["external_request_id"]


async def test_a_providers_refusal_of_a_resend_settles_the_call_as_a_confirmed_failure(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer, executor: Executor
) -> None:
    call, version = await in_doubt(sessions, registry, sandbox, "k-refused")
    async with sessions() as session, session.begin():
        claim = await executor.claim_in(
            session,
            call,
            registry.get("refund"),
            tenant="acme",
            expected=S.RESULT_UNKNOWN,
            dispatch_attempts=1,
            fence=Fence(OWNER, version),
            settles=True,
        )
    refusal = "provider refused the request: HTTP 422 invalid_amount"
    answer = ProviderOutcome(OutcomeKind.FAILED, 1, 422, "req_r", {"code": "x"}, refusal)

    assert await executor.record(claim, answer) is S.CONFIRMED

    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"], row["reconciliation_status"]) == (
        "confirmed",
        "confirmed_failure",
        "settled",
    )
    assert (row["last_error"], row["result"]) == (refusal, {"code": "x"})


@pytest.mark.parametrize("stale", ["owner", "version"])
async def test_a_resend_under_a_fence_no_longer_held_is_refused(
    sessions: Sessions,
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    executor: Executor,
    stale: str,
) -> None:
    call, version = await in_doubt(sessions, registry, sandbox, f"k-stale-{stale}")
    fence = Fence("reconciler-0", version) if stale == "owner" else Fence(OWNER, version - 1)
    with pytest.raises(TransitionConflict, match="is no longer result_unknown"):
        await resend(executor, sessions, registry, call, fence)
    row = await call_row(sessions, call)
    assert (row["status"], row["dispatch_attempts"]) == ("result_unknown", 1)


async def test_a_resends_settlement_is_published_on_the_sites_topics(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer
) -> None:
    """Both steps of the settlement (``accepted``, then ``confirmed``) go to the events
    topic the worker was configured with, not the default one."""
    site = Topics(dispatch="site.commands", events="site.events", escalations="site.escalations")
    call, version = await in_doubt(sessions, registry, sandbox, "k-site")
    async with Transport() as http:
        executor = Executor(sessions, registry, ProviderClient(http), worker_id=OWNER, topics=site)
        assert await resend(executor, sessions, registry, call, Fence(OWNER, version)) is (
            S.CONFIRMED
        )
    published = [
        r["payload"]["eventType"]
        for r in await outbox_rows(sessions, site.events)
        if r["payload"]["toolCallId"] == call
    ]
    assert published == ["tool.call.redispatched", "tool.call.accepted", "tool.call.confirmed"]
    assert [
        r
        for r in await outbox_rows(sessions, DEFAULT_TOPICS.events)
        if r["payload"]["eventType"] in ("tool.call.accepted", "tool.call.confirmed")
    ] == []


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (
            ProviderOutcome(OutcomeKind.UNKNOWN, 1, 500, error="no definitive answer"),
            S.RESULT_UNKNOWN,
        ),
        (
            ProviderOutcome(OutcomeKind.NOT_SENT, 3, error="not sent: ConnectError"),
            S.RESULT_UNKNOWN,
        ),
        (ProviderOutcome(OutcomeKind.ACCEPTED, 1, 202, "req_p"), S.ACCEPTED),
    ],
    ids=["ambiguous", "not-sent", "pending"],
)
async def test_a_resend_answer_that_is_not_final_does_not_settle_the_call(
    sessions: Sessions,
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    executor: Executor,
    answer: ProviderOutcome,
    status: S,
) -> None:
    """Only a final answer settles a re-send: an ambiguous one (with a status code) or
    none at all leaves the call in doubt, and a pending one leaves it accepted."""
    call, version = await in_doubt(sessions, registry, sandbox, f"k-{status}-{answer.kind}")
    async with sessions() as session, session.begin():
        claim = await executor.claim_in(
            session,
            call,
            registry.get("refund"),
            tenant="acme",
            expected=S.RESULT_UNKNOWN,
            dispatch_attempts=1,
            fence=Fence(OWNER, version),
            settles=True,
        )

    assert await executor.record(claim, answer) is status

    row = await call_row(sessions, call)
    assert (row["status"], row["reconciliation_status"]) == (status.value, "pending")
    assert row["verification_status"] == "pending"
    assert (await events_of(sessions, call))[-1]["event_type"] == f"tool.call.{status.value}"
