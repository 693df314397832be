"""A capability's circuit breaker, over the real database and a provider behind a real
proxy that stops listening: counted failures open it and pause the capability for every
tenant, the calls it stops wait in ``authorized`` instead of failing, a probe after the
cool-down closes it and lifts its pause, a failed probe opens it again, and a request
that may have been received keeps the crash rule it had."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator, FormatChecker
from prometheus_client import REGISTRY
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.chaos.proxy import ProxyMode, TcpProxy
from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.capability_views import PauseRequest
from dispatcher.control.actor import Actor
from dispatcher.control.pauses import change_capability, views
from dispatcher.db.tables import capability_states, outbox, tool_calls
from dispatcher.intake.service import submit
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import CapabilityStatus
from dispatcher.states import ExecutionStatus as S
from dispatcher.tenancy import ordering_key
from dispatcher.worker.breakers import Breakers
from dispatcher.worker.executor import Executor
from dispatcher.worker.redrive import redrive_resumed
from tests.fixtures.paths import REPO

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
TOPICS = DEFAULT_TOPICS
BREAKER = {"threshold": 3, "windowSeconds": 60, "coolDownSeconds": 0.2, "probes": 1}


class Provider:
    """The sandbox behind a proxy that can stop listening (connections refused) and
    listen again on the same port."""

    def __init__(self, sandbox: SandboxServer) -> None:
        upstream = httpx.URL(sandbox.url)
        self.sandbox = sandbox
        self.proxy = TcpProxy(upstream.host, upstream.port or 80)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    async def down(self) -> None:
        self.proxy._requested_port = self.proxy.port
        await self.proxy.stop()

    async def up(self) -> None:
        await self.proxy.start()


@pytest.fixture
async def provider(sandbox: SandboxServer) -> AsyncIterator[Provider]:
    found = Provider(sandbox)
    await found.up()
    yield found
    await found.proxy.stop()


@pytest.fixture
def registry(provider: Provider) -> CapabilityRegistry:
    # Four attempts a call: the breaker, at three failures, stops the first call's.
    lone = {**BREAKER, "threshold": 100}
    return registry_of(
        capability("send", provider.url, attempts=4, breaker=BREAKER),
        capability("lone", provider.url, attempts=2, breaker=lone),
    )


@pytest.fixture
async def gated(
    sessions: Sessions, registry: CapabilityRegistry
) -> AsyncIterator[tuple[Executor, Breakers]]:
    breakers = Breakers(sessions, registry, topics=TOPICS)
    async with Transport() as http:
        client = ProviderClient(http).guarded(breakers)
        yield Executor(sessions, registry, client, worker_id="worker-a", topics=TOPICS), breakers


async def submitted(sessions: Sessions, registry: CapabilityRegistry, tenant: str, n: int) -> str:
    async with sessions() as session, session.begin():
        done = await submit(
            session,
            SubmitRequest(run_id="r", capability_id="send", input={"to": f"u{n}@example.com"}),
            tenant=tenant,
            registry=registry,
        )
    return done.view.tool_call_id


async def statuses(sessions: Sessions) -> dict[tuple[str, str], str]:
    async with sessions() as session:
        rows = await session.execute(
            select(tool_calls.c.tenant, tool_calls.c.tool_call_id, tool_calls.c.status)
        )
        return {(r.tenant, r.tool_call_id): r.status for r in rows}


async def pause_of(sessions: Sessions) -> Any:
    async with sessions() as session:
        return (
            await session.execute(
                select(capability_states).where(capability_states.c.capability_id == "send")
            )
        ).one_or_none()


async def breaker_state(sessions: Sessions) -> str:
    async with sessions() as session:
        found = await session.execute(
            text("SELECT state FROM capability_breakers WHERE capability_id = 'send'")
        )
        return str(found.scalar_one())


async def messages(sessions: Sessions, key: str) -> list[dict[str, Any]]:
    async with sessions() as session:
        rows = await session.execute(
            select(outbox.c.payload).where(outbox.c.key == key).order_by(outbox.c.id)
        )
        return list(rows.scalars())


async def opened(
    sessions: Sessions, registry: CapabilityRegistry, executor: Executor, provider: Provider
) -> list[tuple[str, str]]:
    """Two tenants' calls (one id each, colliding), the provider down, each sent once."""
    calls = [("acme", await submitted(sessions, registry, "acme", n)) for n in range(3)]
    calls += [("globex", await submitted(sessions, registry, "globex", n)) for n in range(3)]
    await provider.down()
    for tenant, call in calls:
        await executor.execute(call, tenant)
    return calls


async def test_an_outage_opens_the_breaker_and_no_call_fails(
    sessions: Sessions, registry: CapabilityRegistry, gated: tuple[Executor, Breakers],
    provider: Provider,
) -> None:  # fmt: skip
    executor, _ = gated

    def counted() -> tuple[float, float]:
        opens = REGISTRY.get_sample_value(
            "tool_dispatcher_breaker_transitions_total", {"capability": "send", "to": "open"}
        )
        failures = REGISTRY.get_sample_value(
            "tool_dispatcher_breaker_failures_total",
            {"capability": "send", "failure": "not_sent"},
        )
        return opens or 0.0, failures or 0.0

    before = counted()
    calls = await opened(sessions, registry, executor, provider)
    after = counted()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 3)

    found = await statuses(sessions)
    assert set(found.values()) == {S.AUTHORIZED.value}, found
    assert await breaker_state(sessions) == "open"
    pause = await pause_of(sessions)
    assert pause.tenant == "" and pause.status == "paused"
    assert pause.actor["via"] == "breaker" and "3 failures" in pause.reason
    async with sessions() as session:
        first = (
            await session.execute(
                text(
                    "SELECT dispatch_attempts, last_error FROM tool_calls "
                    "WHERE tenant = :t AND tool_call_id = :c"
                ),
                {"t": calls[0][0], "c": calls[0][1]},
            )
        ).one()
        held = (
            await session.execute(
                text(
                    "SELECT payload FROM execution_events "
                    "WHERE event_type = 'tool.call.redispatched'"
                )
            )
        ).scalars().all()  # fmt: skip
    # Only the first call was claimed: three attempts, refused, then held back; the
    # others were never claimed (the breaker's pause).
    assert len(held) == 1 and held[0]["attempts"] == 3 and held[0]["to"] == "authorized"
    assert "held by the circuit breaker" in first.last_error
    async with sessions() as session:
        seen = {v.capability_id: v for v in (await views(session, list(registry), "globex"))}
    assert seen["send"].status == "paused" and seen["send"].breaker is not None
    assert seen["send"].breaker.state == "open" and seen["send"].breaker.failures == 3
    assert seen["lone"].breaker is not None and seen["lone"].breaker.state == "closed"
    facts = await messages(sessions, "capability/send")
    assert [m["eventType"] for m in facts] == ["capability.paused", "capability.breaker_opened"]
    assert [e["class"] for e in facts[1]["evidence"]] == ["not_sent"] * 3
    async with sessions() as session:
        told = (
            await session.execute(
                text("SELECT event_type, tenant, data FROM webhook_notifications")
            )
        ).all()
    # Every tenant's subscribers are told, with the evidence and no call of anyone's.
    assert [(t.event_type, t.tenant) for t in told] == [("breaker.opened", None)]
    assert told[0].data["capabilityId"] == "send" and "toolCallId" not in told[0].data
    for fact in facts:
        schema = json.loads(
            (REPO / "docs/events/capability" / f"{fact['eventType']}.json").read_text()
        )
        Draft202012Validator(schema, format_checker=FormatChecker()).validate(fact)


async def test_a_probe_after_the_cool_down_closes_it_and_every_call_completes_once(
    sessions: Sessions, registry: CapabilityRegistry, gated: tuple[Executor, Breakers],
    provider: Provider, sandbox: SandboxServer,
) -> None:  # fmt: skip
    executor, breakers = gated
    calls = await opened(sessions, registry, executor, provider)
    await provider.up()
    async with sessions() as session:
        cool_down = (
            await session.execute(
                text(
                    "SELECT extract(epoch FROM probe_at - opened_at) FROM capability_breakers"
                    " WHERE capability_id = 'send'"
                )
            )
        ).scalar_one()
    assert float(cool_down) == BREAKER["coolDownSeconds"]
    await asyncio.sleep(0.25)
    await breakers.step(executor)  # half-open, one probe, answered: closed

    assert await breaker_state(sessions) == "closed"
    pause = await pause_of(sessions)
    assert pause.status == "active"
    # Timed after the close committed (dispatcher.ledger.pauses.after_resume).
    assert pause.resumed_at > pause.changed_at
    found = await statuses(sessions)
    assert sorted(found.values()).count(S.COMPLETED.value) == 1  # the probe
    # Lifting the pause re-drives the waiting calls (their first commands went out).
    async with sessions() as session, session.begin():
        await session.execute(text("UPDATE outbox SET published_at = now()"))
    redriven = await redrive_resumed(sessions, topics=TOPICS, older_than_seconds=60)
    assert len(redriven) == len(calls) - 1
    for tenant, call in calls:
        await executor.execute(call, tenant)
    assert set((await statuses(sessions)).values()) == {S.COMPLETED.value}
    counts = await sandbox.store.counts()
    assert len(counts.effects) == len(calls) and set(counts.effects.values()) == {1}
    facts = [m["eventType"] for m in await messages(sessions, "capability/send")]
    assert facts[-2:] == ["capability.resumed", "capability.breaker_closed"]


async def test_a_failed_probe_opens_it_again(
    sessions: Sessions, registry: CapabilityRegistry, gated: tuple[Executor, Breakers],
    provider: Provider,
) -> None:  # fmt: skip
    executor, breakers = gated
    await opened(sessions, registry, executor, provider)
    await asyncio.sleep(0.25)
    await breakers.step(executor)  # the probe is refused

    assert await breaker_state(sessions) == "open"
    assert (await pause_of(sessions)).status == "paused"
    assert set((await statuses(sessions)).values()) == {S.AUTHORIZED.value}
    facts = [m["eventType"] for m in await messages(sessions, "capability/send")]
    assert facts == ["capability.paused", "capability.breaker_opened", "capability.breaker_opened"]


async def test_no_probe_goes_through_an_operators_pause_and_their_resume_closes_it(
    sessions: Sessions, registry: CapabilityRegistry, gated: tuple[Executor, Breakers],
    provider: Provider,
) -> None:  # fmt: skip
    executor, breakers = gated
    await opened(sessions, registry, executor, provider)
    # An operator's pause of every tenant, made while the breaker held it.
    async with sessions() as session, session.begin():
        await session.execute(
            text(
                'UPDATE capability_states SET actor = \'{"name": "oncall", "via": "api"}\''
                " WHERE capability_id = 'send'"
            )
        )
    await provider.up()
    await asyncio.sleep(0.25)
    await breakers.step(executor)  # half-open, but the operator holds every call
    assert await breaker_state(sessions) == "half_open"
    assert set((await statuses(sessions)).values()) == {S.AUTHORIZED.value}
    async with sessions() as session, session.begin():
        change = await change_capability(
            session, "send", PauseRequest(reason="back", every_tenant=True),
            CapabilityStatus.ACTIVE, tenant="acme", actor=Actor("oncall", "acme", "api"),
            registry=registry,
        )  # fmt: skip
    assert change.changed
    assert await breaker_state(sessions) == "closed"
    assert (await pause_of(sessions)).status == "active"


async def test_a_request_that_may_have_been_received_is_not_held(
    sessions: Sessions, registry: CapabilityRegistry, gated: tuple[Executor, Breakers],
    provider: Provider,
) -> None:  # fmt: skip
    executor, _ = gated
    calls = [await submitted(sessions, registry, "acme", n) for n in range(4)]
    # Connections accepted and cut: each request may have reached the provider.
    provider.proxy.set_mode(ProxyMode.CUT)
    for call in calls:
        await executor.execute(call, "acme")
    found = await statuses(sessions)
    # Three in doubt (the reconciler finds out) opened the breaker; the fourth waits.
    assert sorted(found.values()) == [S.AUTHORIZED.value] + [S.RESULT_UNKNOWN.value] * 3
    assert await breaker_state(sessions) == "open"


async def test_a_call_that_spent_its_attempts_waits_for_the_breaker_a_bounded_number_of_times(
    sessions: Sessions, registry: CapabilityRegistry, gated: tuple[Executor, Breakers],
    provider: Provider,
) -> None:  # fmt: skip
    executor, _ = gated
    async with sessions() as session, session.begin():
        done = await submit(
            session,
            SubmitRequest(run_id="r", capability_id="lone", input={"to": "a@example.com"}),
            tenant="acme",
            registry=registry,
        )
    call = done.view.tool_call_id
    await provider.down()
    # Two refused attempts, far below the threshold: not the call's failure, it waits,
    # with no new command (not held by the gate: sent again at once, it would spend
    # its claims on a provider still down).
    assert await executor.execute(call, "acme") is S.AUTHORIZED
    assert len(await messages(sessions, ordering_key("acme", call))) == 1
    # Claimed as often as its policy has attempts: it fails as it would without one.
    assert await executor.execute(call, "acme") is S.FAILED


@pytest.mark.parametrize("resumed", [True, False])
async def test_a_call_a_stale_view_held_after_the_breaker_closed_is_sent_again_at_once(
    sessions: Sessions, registry: CapabilityRegistry, gated: tuple[Executor, Breakers],
    provider: Provider, resumed: bool,
) -> None:  # fmt: skip
    """Worker A claims a call; worker B's failures open the breaker and A learns it;
    the breaker closes (an operator's resume) before A sends: A's gate, its view stale,
    holds the call, recorded back in ``authorized`` after the resume, so the resume's
    drain (calls authorized before it) never sees it. A new command goes at once, caused
    by the hold's event; while the capability is still paused, none does."""
    executor_a, breakers_a = gated
    call = await submitted(sessions, registry, "acme", 0)
    claim = await executor_a.claim(call, "acme")
    assert claim is not None
    await provider.down()
    async with Transport() as http:
        client = ProviderClient(http).guarded(Breakers(sessions, registry, topics=TOPICS))
        executor_b = Executor(sessions, registry, client, worker_id="worker-b", topics=TOPICS)
        await executor_b.execute(await submitted(sessions, registry, "acme", 1), "acme")
    assert await breaker_state(sessions) == "open"
    await breakers_a.step(executor_a)  # A learns it, after its claim (before the cool-down)
    if resumed:
        async with sessions() as session, session.begin():
            await change_capability(
                session, "send", PauseRequest(reason="back", every_tenant=True),
                CapabilityStatus.ACTIVE, tenant="acme", actor=Actor("oncall", "acme", "api"),
                registry=registry,
            )  # fmt: skip
        assert await breaker_state(sessions) == "closed"
    await provider.up()

    assert await executor_a.run(claim) is S.AUTHORIZED
    async with sessions() as session:
        hold = (
            await session.execute(
                text(
                    "SELECT event_id, payload FROM execution_events WHERE tool_call_id = :c"
                    " AND event_type = 'tool.call.redispatched'"
                ),
                {"c": call},
            )
        ).one()
    assert hold.payload["attempts"] == 0  # held by the gate, nothing sent
    commands = await messages(sessions, ordering_key("acme", call))
    if not resumed:
        assert len(commands) == 1  # intake's: the resume's drain writes the next
        return
    assert len(commands) == 2
    assert commands[1]["causationId"] == hold.event_id
    assert commands[1]["toolCallId"] == call and commands[1]["tenant"] == "acme"
    # Claimed again after A learned of the breaker: A's gate lets it go.
    assert await executor_a.execute(call, "acme") is S.COMPLETED
