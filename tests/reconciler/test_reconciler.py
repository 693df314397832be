"""The reconciler against the real sandbox provider and real PostgreSQL: each way a
call in doubt gets settled, and the ways it gets handed to a person exactly once."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.compensation import request_compensation
from dispatcher.db.tables import tool_calls
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.tenancy import ordering_key
from dispatcher.worker.executor import Executor
from dispatcher.worker.recovery import recover_expired
from reconciler import Tally, metrics
from tests.fixtures.calls import age_calls, expire_leases, make_due, submit_call, unknown_call
from tests.fixtures.capabilities import reconcile_capability
from tests.fixtures.reconciling import new_reconciler, until_settled
from tests.fixtures.rows import call_row, escalation_messages, escalation_rows, events_of
from tests.fixtures.sandbox import add_fault, at_provider, books

pytestmark = pytest.mark.postgres


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    url = sandbox.url
    return registry_of(
        reconcile_capability("refund", url),
        reconcile_capability("refund-no-resend", url, reconcile={"onNotFound": "confirm_failure"}),
        reconcile_capability(
            "refund-slow-lookup", url, lookup_timeout=0.2, reconcile={"maxAttempts": 3}
        ),
        reconcile_capability(
            "refund-short-window", url, reconcile={"idempotencyWindowSeconds": 60}
        ),
        # Waits out a held lookup (see the take-over test) instead of timing out.
        reconcile_capability("refund-patient-lookup", url, lookup_timeout=30),
    )


async def test_dropped_response_is_confirmed_from_the_provider(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await unknown_call(
        sessions, registry, http, sandbox.url, "refund", "k-drop", {"kind": "drop_after_apply"}
    )
    assert (await call_row(sessions, call))["external_request_id"] is None

    tally = await new_reconciler(sessions, registry, http).run_pass()

    assert tally.counts == {"confirmed_success": 1}
    row = await call_row(sessions, call)
    assert row["status"] == "confirmed"
    assert row["verification_status"] == "confirmed_success"
    assert row["reconciliation_status"] == "settled"
    assert row["result"] == {"echo": {"n": 1}}
    assert row["external_request_id"].startswith("req_")  # found by key
    assert row["lease_owner"] is None and row["next_reconcile_at"] is None
    confirmed = [
        e for e in await events_of(sessions, call) if e["event_type"].endswith("confirmed")
    ]
    assert len(confirmed) == 1
    assert confirmed[0]["payload"]["lookup"]["via"] == "idempotencyKey"
    assert (await books(sandbox.url))["effects"] == {at_provider("k-drop"): 1}


async def test_a_request_that_never_arrived_is_sent_again_with_the_same_key(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await unknown_call(
        sessions, registry, http, sandbox.url, "refund", "k-lost", {"kind": "drop_before_apply"}
    )
    assert (await books(sandbox.url))["effects"] == {}

    tally = await until_settled(new_reconciler(sessions, registry, http))

    assert tally.counts == {"redispatched": 1}
    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"]) == ("confirmed", "confirmed_success")
    assert row["reconciliation_status"] == "settled"
    assert row["dispatch_attempts"] == 2
    types = [e["event_type"] for e in await events_of(sessions, call)]
    assert types[-4:] == [
        "tool.call.result_unknown",
        "tool.call.redispatched",
        "tool.call.accepted",
        "tool.call.confirmed",
    ]
    counts = await books(sandbox.url)
    assert counts["effects"] == {at_provider("k-lost"): 1}
    # The lost POST, one lookup by key (404), the re-sent POST.
    assert counts["received"] == {at_provider("k-lost"): 3}


async def test_a_call_marked_unknown_before_it_was_sent_is_sent_once(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await submit_call(sessions, registry, "refund", {"n": 7}, key="k-died")
    executor = Executor(
        sessions, registry, ProviderClient(http), worker_id="w-dead", topics=Topics(events="events")
    )
    assert await executor.claim(call, "acme") is not None  # the worker dies before sending
    await expire_leases(sessions)
    report = await recover_expired(sessions, registry, topics=Topics(events="events"))
    assert report.marked_unknown == [call]

    await until_settled(new_reconciler(sessions, registry, http))

    assert (await call_row(sessions, call))["status"] == "confirmed"
    assert (await books(sandbox.url))["effects"] == {at_provider("k-died"): 1}


async def test_no_record_under_confirm_failure_policy_is_a_confirmed_failure(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await unknown_call(
        sessions,
        registry,
        http,
        sandbox.url,
        "refund-no-resend",
        "k-none",
        {"kind": "drop_before_apply"},
    )
    reconciler = new_reconciler(sessions, registry, http)
    await reconciler.run_pass()
    # Dispatched a moment ago: the request may still arrive, so no verdict yet.
    assert (await call_row(sessions, call))["status"] == "result_unknown"
    await age_calls(sessions, 31)
    await make_due(sessions)
    assert (await reconciler.run_pass()).counts == {"confirmed_failure": 1}
    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"]) == ("confirmed", "confirmed_failure")
    assert (await books(sandbox.url))["received"] == {at_provider("k-none"): 3}  # POST + 2 lookups


async def test_a_request_landing_after_a_first_no_record_is_not_taken_for_a_failure(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    """What a chaos run caught: a request held by a stalling proxy reached the provider
    after the reconciler had been told "no record" and had settled the call a failure."""
    call = await unknown_call(
        sessions, registry, http, sandbox.url, "refund-no-resend", "k-late",
        {"kind": "drop_before_apply"},
    )  # fmt: skip
    reconciler = new_reconciler(sessions, registry, http)
    await reconciler.run_pass()
    assert (await call_row(sessions, call))["status"] == "result_unknown"
    async with httpx.AsyncClient() as client:
        landed = await client.post(
            f"{sandbox.url}/v1/requests",
            json={"n": 1},
            headers={"Idempotency-Key": at_provider("k-late")},
        )
    assert landed.status_code < 300
    await make_due(sessions)
    await until_settled(reconciler)
    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"]) == ("confirmed", "confirmed_success")
    assert (await books(sandbox.url))["effects"] == {at_provider("k-late"): 1}


async def test_provider_failure_is_a_confirmed_failure(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await unknown_call(
        sessions,
        registry,
        http,
        sandbox.url,
        "refund",
        "k-fail",
        {"kind": "drop_after_apply"},
        {"simulate": "fail"},
    )
    assert (await new_reconciler(sessions, registry, http).run_pass()).counts == {
        "confirmed_failure": 1
    }
    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"]) == ("confirmed", "confirmed_failure")
    assert "failed" in row["last_error"] or "failure" in row["last_error"]
    assert (await books(sandbox.url))["effects"] == {}


async def test_accepted_pending_call_is_confirmed_once_the_provider_finishes(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await submit_call(
        sessions, registry, "refund", {"simulate": "pending", "pendingLookups": 2}, key="k-pend"
    )
    executor = Executor(
        sessions, registry, ProviderClient(http), worker_id="w", topics=Topics(events="events")
    )
    assert (await executor.execute(call, "acme")).value == "accepted"  # type: ignore[union-attr]
    await make_due(sessions)

    tally = await until_settled(new_reconciler(sessions, registry, http))

    assert tally.counts == {"retry_later": 2, "confirmed_success": 1}
    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"]) == ("confirmed", "confirmed_success")
    assert row["reconcile_attempts"] == 3
    attempts = [
        e["payload"]
        for e in await events_of(sessions, call)
        if e["event_type"] == "tool.call.reconcile_attempted"
    ]
    assert [a["lookup"]["observation"] for a in attempts] == ["pending", "pending"]
    # Backoff grows per the capability's policy: 0.01 s, then 0.02 s.
    assert [a["nextInSeconds"] for a in attempts] == [0.01, 0.02]
    assert (await books(sandbox.url))["effects"] == {at_provider("k-pend"): 1}


async def test_compensation_requested_while_unknown_undoes_the_effect_once(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await unknown_call(
        sessions, registry, http, sandbox.url, "refund", "k-stop", {"kind": "drop_after_apply"}
    )
    async with sessions() as session, session.begin():
        assert await request_compensation(
            session, call, tenant="acme", reason="run stopped", producer="tool-dispatcher.operator"
        )
        assert not await request_compensation(
            session, call, tenant="acme", reason="again", producer="tool-dispatcher.operator"
        )
    # The first compensation's answer is lost: the next pass sends it again (same key).
    await add_fault(
        sandbox.url,
        {"kind": "drop_after_apply", "pathPrefix": "/v1/requests/", "method": "POST", "times": 1},
    )

    tally = await until_settled(new_reconciler(sessions, registry, http))

    assert tally.counts == {"retry_later": 1, "compensated": 1}
    row = await call_row(sessions, call)
    assert row["status"] == "compensated"
    assert row["result"]["reversal"]["reversalKey"] == f"compensate:{at_provider('k-stop')}"
    counts = await books(sandbox.url)
    assert counts["effects"] == {at_provider("k-stop"): 1}
    assert counts["reversals"] == {at_provider("k-stop"): 1}
    types = [e["event_type"] for e in await events_of(sessions, call)]
    assert "tool.call.compensation_requested" in types
    assert types[-1] == "tool.call.compensated"


async def test_lookups_timing_out_escalate_exactly_once_under_five_overlapping_passes(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    calls = [
        await unknown_call(
            sessions,
            registry,
            http,
            sandbox.url,
            "refund-slow-lookup",
            f"k-slow-{i}",
            {"kind": "drop_after_apply"},
        )
        for i in range(4)
    ]
    await add_fault(
        sandbox.url, {"kind": "timeout", "method": "GET", "keyPrefix": at_provider("k-slow-")}
    )
    reconcilers = [new_reconciler(sessions, registry, http, batch_size=2) for _ in range(5)]

    for _ in range(4):  # maxAttempts = 3: the third failed lookup escalates
        await asyncio.gather(*(r.run_pass() for r in reconcilers))
        await make_due(sessions)

    for call in calls:
        row = await call_row(sessions, call)
        assert (row["status"], row["verification_status"]) == ("escalated", "inconclusive")
        assert row["reconciliation_status"] == "escalated"
        assert row["reconcile_attempts"] == 3
        escalated = [
            e for e in await events_of(sessions, call) if e["event_type"] == "tool.call.escalated"
        ]
        assert len(escalated) == 1
    records = await escalation_rows(sessions)
    assert sorted(r["tool_call_id"] for r in records) == sorted(calls)
    assert {r["episode"] for r in records} == {1}
    messages = await escalation_messages(sessions)
    assert sorted(m["key"] for m in messages) == sorted(ordering_key("acme", c) for c in calls)
    assert {m["headers"]["ce_id"] for m in messages} == {r["escalation_id"] for r in records}

    evidence = records[0]["evidence"]
    assert evidence["call"]["input"] == {"n": 1}
    assert evidence["call"]["idempotencyKey"].startswith("k-slow-")
    assert "SocketTimeoutError" in evidence["lastError"]
    attempts = [h for h in evidence["history"] if h["eventType"] == "tool.call.reconcile_attempted"]
    assert [a["payload"]["lookup"]["observation"] for a in attempts] == ["lookup_failed"] * 2
    assert evidence["lastAnswer"]["error"] == "lookup: SocketTimeoutError"
    assert any(line.startswith("GET http") for line in evidence["providerLookup"])
    esc_id = records[0]["escalation_id"]
    assert f"tool-dispatcher escalations ack {esc_id}" in evidence["commands"]["cli"]
    assert f"POST /v1/escalations/{esc_id}/acknowledge" in evidence["commands"]["http"]

    lookup_errors = REGISTRY.get_sample_value(
        "tool_dispatcher_reconciler_lookup_errors_total", {"capability": "refund-slow-lookup"}
    )
    assert lookup_errors is not None and lookup_errors >= 12
    await metrics.refresh(sessions)
    assert REGISTRY.get_sample_value("tool_dispatcher_reconciler_open_escalations") == 4
    assert REGISTRY.get_sample_value("tool_dispatcher_reconciler_unknown_backlog") == 0


async def test_past_the_idempotency_window_it_escalates_without_sending_anything(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await unknown_call(
        sessions,
        registry,
        http,
        sandbox.url,
        "refund-short-window",
        "k-old",
        {"kind": "drop_before_apply"},
    )
    await age_calls(sessions, 120)  # dispatched two minutes ago; the window is one
    before = await books(sandbox.url)

    tally = await new_reconciler(sessions, registry, http).run_pass()

    assert tally.counts == {"escalated": 1}
    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"]) == ("escalated", "inconclusive")
    assert await books(sandbox.url) == before  # not even a lookup by the forgotten key
    [record] = await escalation_rows(sessions)
    assert "idempotency window" in record["evidence"]["lastAnswer"]["error"]


async def test_metrics_report_the_backlog_and_its_oldest_call(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    await unknown_call(
        sessions, registry, http, sandbox.url, "refund", "k-m", {"kind": "drop_after_apply"}
    )
    await age_calls(sessions, 30)
    await metrics.refresh(sessions)
    assert REGISTRY.get_sample_value("tool_dispatcher_reconciler_unknown_backlog") == 1
    oldest = REGISTRY.get_sample_value("tool_dispatcher_reconciler_oldest_unknown_age_seconds")
    assert oldest is not None and 29 < oldest < 60
    before = REGISTRY.get_sample_value(
        "tool_dispatcher_reconciler_outcomes_total", {"outcome": "confirmed_success"}
    )

    await new_reconciler(sessions, registry, http).run_pass()

    await metrics.refresh(sessions)
    assert REGISTRY.get_sample_value("tool_dispatcher_reconciler_unknown_backlog") == 0
    assert REGISTRY.get_sample_value("tool_dispatcher_reconciler_oldest_unknown_age_seconds") == 0
    after = REGISTRY.get_sample_value(
        "tool_dispatcher_reconciler_outcomes_total", {"outcome": "confirmed_success"}
    )
    assert (after or 0) - (before or 0) == 1


async def test_a_reconciler_whose_claim_was_taken_over_records_nothing(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await unknown_call(
        sessions,
        registry,
        http,
        sandbox.url,
        "refund-patient-lookup",
        "k-stall",
        {"kind": "drop_after_apply"},
    )
    slow = new_reconciler(sessions, registry, http, lease_seconds=0.01)
    fast = new_reconciler(sessions, registry, http)
    # The slow one's lookup is held at the sandbox (well within its lookup timeout)
    # while its lease ends and the fast one claims and settles the call.
    held = {
        "kind": "latency",
        "latencyMs": 5000,
        "method": "GET",
        "idempotencyKey": at_provider("k-stall"),
    }
    await add_fault(sandbox.url, {**held, "times": 1})
    slow_pass = asyncio.create_task(slow.run_pass())
    await held_lookup_arrived(http, sandbox.url, slow_pass)  # so slow has claimed the call
    await lease_ended(sessions, call)
    fast_tally = await fast.run_pass()
    slow_tally = await slow_pass

    assert fast_tally.counts == {"confirmed_success": 1}
    assert slow_tally.counts == {"taken_over": 1}
    confirmed = [
        e for e in await events_of(sessions, call) if e["event_type"].endswith("confirmed")
    ]
    assert len(confirmed) == 1


async def held_lookup_arrived(
    http: Transport, sandbox_url: str, slow_pass: asyncio.Task[Tally]
) -> None:
    """Until the sandbox has used up its one ``latency`` rule: the lookup it holds has
    arrived there."""
    for _ in range(3000):
        async with httpx.AsyncClient() as client:
            rules = (await client.get(f"{sandbox_url}/v1/faults")).json()["rules"]
        if not any(rule["kind"] == "latency" for rule in rules):
            return
        if slow_pass.done():
            raise AssertionError(f"the pass ended without a lookup: {slow_pass.result()}")
        await asyncio.sleep(0.01)
    raise AssertionError("the held lookup never reached the sandbox")


async def lease_ended(sessions: async_sessionmaker[AsyncSession], call: str) -> None:
    """Until the call's lease has run out by the database's clock (what "due" is
    measured against), so another reconciler's pass finds it due."""
    for _ in range(3000):
        async with sessions() as session:
            ended = await session.scalar(
                select(tool_calls.c.next_reconcile_at <= func.now()).where(
                    tool_calls.c.tool_call_id == call
                )
            )
        if ended:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the slow reconciler's lease never ran out")


async def test_the_events_of_a_settlement_are_published_through_the_outbox(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await unknown_call(
        sessions, registry, http, sandbox.url, "refund", "k-pub", {"kind": "drop_after_apply"}
    )
    await new_reconciler(sessions, registry, http).run_pass()
    from tests.fixtures.rows import outbox_rows

    published = [
        r["payload"]
        for r in await outbox_rows(sessions, DEFAULT_TOPICS.events)
        if r["payload"]["toolCallId"] == call
    ]
    assert published[-1]["eventType"] == "tool.call.confirmed"
    assert published[-1]["producer"] == "tool-dispatcher.reconciler"
