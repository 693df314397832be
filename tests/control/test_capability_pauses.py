"""Pausing a capability while its provider is down: over the real API and database, its
calls wait in ``authorized`` (the claim leaves them, the redrive leaves them), burn no
attempt, and go with their same keys when it resumes; a tenant's pause holds no other
tenant's calls; every move is a fact, and a pause of a paused scope is none."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from jsonschema import Draft202012Validator, FormatChecker
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.capability_views import PauseRequest
from dispatcher.control.actor import Actor
from dispatcher.control.pauses import after_change, change_capability
from dispatcher.db.tables import outbox, tool_calls
from dispatcher.intake.service import submit
from dispatcher.ledger.pauses import after_resume
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS, ApiKey, Settings, hash_api_key
from dispatcher.states import CapabilityStatus
from dispatcher.worker.executor import Executor
from dispatcher.worker.redrive import redrive_resumed, redrive_stale
from tests.fixtures.api import GLOBEX, OPERATOR, READER, bearer, control_keys
from tests.fixtures.paths import REPO

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
ADMIN = "tdk_test_root_admin"
TOPICS = DEFAULT_TOPICS


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(capability("refund", sandbox.url), capability("send", sandbox.url))


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    admin = ApiKey(
        sha256=hash_api_key(ADMIN), tenant="root", scopes=["operate", "read", "admin"], name="root"
    )
    return settings.model_copy(update={"api_keys": [*control_keys(), admin]})


@pytest.fixture
async def executor(sessions: Sessions, registry: CapabilityRegistry) -> AsyncIterator[Executor]:
    async with Transport() as http:
        yield Executor(
            sessions, registry, ProviderClient(http), worker_id="worker-a", topics=TOPICS
        )


async def submitted(sessions: Sessions, registry: CapabilityRegistry, tenant: str, n: int) -> str:
    async with sessions() as session, session.begin():
        done = await submit(
            session,
            SubmitRequest(run_id="r", capability_id="refund", input={"orderId": f"o-{n}"}),
            tenant=tenant,
            registry=registry,
        )
    return done.view.tool_call_id


async def relayed(sessions: Sessions) -> None:
    """Every outbox row published, as the relay would have done by now."""
    async with sessions() as session, session.begin():
        await session.execute(text("UPDATE outbox SET published_at = now()"))


async def timed_after_commit(sessions: Sessions) -> list[bool]:
    """Whether each resumed scope's resume was timed after its commit."""
    async with sessions() as session:
        found = await session.execute(
            text("SELECT resumed_at > changed_at FROM capability_states WHERE status = 'active'")
        )
        return list(found.scalars())


async def change(api: httpx.AsyncClient, key: str, verb: str, **body: object) -> httpx.Response:
    return await api.post(
        f"/v1/capabilities/refund/{verb}", json={"reason": "provider down", **body},
        headers=bearer(key),
    )  # fmt: skip


async def listed(api: httpx.AsyncClient, key: str) -> dict[str, dict[str, object]]:
    reply = await api.get("/v1/capabilities", headers=bearer(key))
    assert reply.status_code == 200, reply.text
    return {c["capabilityId"]: c for c in reply.json()["capabilities"]}


async def test_a_tenants_pause_holds_its_calls_until_resumed_and_no_others(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    paused = await change(api, OPERATOR, "pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["changed"] is True
    assert paused.json()["capability"]["status"] == "paused"
    again = await change(api, OPERATOR, "pause")
    assert again.json()["changed"] is False  # nothing moved, no second fact

    held = await submitted(sessions, registry, "acme", 1)
    other = await submitted(sessions, registry, "globex", 1)
    assert await executor.claim(held, "acme") is None
    assert await executor.claim(other, "globex") is not None
    # The regular redrive leaves the waiting call alone, however long it waits.
    await relayed(sessions)  # the held call's command went out and was dropped
    assert await redrive_stale(sessions, topics=TOPICS, older_than_seconds=0.001) == []
    acme = await listed(api, READER)
    assert acme["refund"]["status"] == "paused" and acme["refund"]["waiting"] == 1
    assert acme["send"]["status"] == "active"
    assert (await listed(api, GLOBEX))["refund"]["status"] == "active"

    resumed = await change(api, OPERATOR, "resume")
    assert resumed.json()["changed"] is True
    assert resumed.json()["capability"]["status"] == "active"
    assert await timed_after_commit(sessions) == [True]
    assert await redrive_resumed(sessions, topics=TOPICS, older_than_seconds=60) == [held]
    claim = await executor.claim(held, "acme")
    assert claim is not None
    async with sessions() as session:
        row = (
            await session.execute(select(tool_calls).where(tool_calls.c.tool_call_id == held))
        ).one()
    assert row.dispatch_attempts == 1  # the pause burnt none
    # Resumed once: a second sweep writes nothing more.
    assert await redrive_resumed(sessions, topics=TOPICS, older_than_seconds=60) == []


async def test_a_command_dropped_while_the_resume_commits_is_written_again_at_once(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    """A claim that cannot see the resume yet (it has not committed) drops the command of
    a call authorized after the resume's transaction began; the drain after the resume
    still writes that call's command again, not the regular redrive a minute later."""
    assert (await change(api, OPERATOR, "pause")).json()["changed"] is True
    async with sessions() as resuming, resuming.begin():
        resumed = await change_capability(
            resuming, "refund", PauseRequest(reason="provider back"), CapabilityStatus.ACTIVE,
            tenant="acme", actor=Actor("ana", "acme", "api"), registry=registry, topics=TOPICS,
        )  # fmt: skip
        late = await submitted(sessions, registry, "acme", 1)
        assert await executor.claim(late, "acme") is None  # dropped: still paused here
        await relayed(sessions)
    await after_change(sessions, resumed, CapabilityStatus.ACTIVE)
    assert await redrive_resumed(sessions, topics=TOPICS, older_than_seconds=60) == [late]
    assert await executor.claim(late, "acme") is not None


async def test_a_resume_makes_the_looks_its_pause_put_off_due_at_once(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    """While a capability is paused the reconciler puts off a re-send of a call in doubt
    to its longest delay; the tenant's resume makes that look due at once, and no other
    tenant's."""
    assert (await change(api, OPERATOR, "pause")).json()["changed"] is True
    ours = await submitted(sessions, registry, "acme", 1)
    await submitted(sessions, registry, "globex", 2)
    async with sessions() as session, session.begin():
        # Where a put-off look leaves a call in doubt (reconciler.rulings.held_if_paused).
        await session.execute(
            text(
                "UPDATE tool_calls SET status = 'result_unknown', reconciliation_status ="
                " 'pending', next_reconcile_at = now() + interval '300 seconds'"
            )
        )
    assert (await change(api, OPERATOR, "resume")).json()["changed"] is True
    async with sessions() as session:
        due = await session.execute(
            text("SELECT tool_call_id FROM tool_calls WHERE next_reconcile_at <= now()")
        )
        assert list(due.scalars()) == [ours]


async def test_what_follows_a_resume_never_fails_the_resume(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The resume has committed: a database gone by then is logged, not raised."""
    gone = create_async_engine("postgresql+psycopg://postgres@127.0.0.1:9/gone")
    try:
        await after_resume(async_sessionmaker(gone), "refund")
    finally:
        await gone.dispose()
    assert "not timed after its commit" in caplog.text


async def test_every_tenant_takes_the_admin_scope(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    refused = await change(api, OPERATOR, "pause", everyTenant=True)
    assert refused.status_code == 403
    assert refused.json()["code"] == "forbidden"
    assert (await change(api, ADMIN, "pause", everyTenant=True)).json()["changed"] is True
    for key in (READER, GLOBEX):
        assert (await listed(api, key))["refund"]["status"] == "paused"
    call = await submitted(sessions, registry, "globex", 2)
    assert await executor.claim(call, "globex") is None
    # A tenant's resume does not lift a pause of every tenant.
    assert (await change(api, GLOBEX, "resume")).json()["changed"] is False
    await relayed(sessions)
    assert (await change(api, ADMIN, "resume", everyTenant=True)).json()["changed"] is True
    assert await redrive_resumed(sessions, topics=TOPICS, older_than_seconds=60) == [call]
    assert await executor.claim(call, "globex") is not None


async def test_each_move_is_a_fact_on_the_log_and_the_events_topic(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    await change(api, OPERATOR, "pause")
    await change(api, OPERATOR, "pause")
    await change(api, OPERATOR, "resume")
    async with sessions() as session:
        facts = (
            await session.execute(
                text("SELECT event_type, tenant, reason, actor FROM capability_events ORDER BY seq")
            )
        ).all()
        messages = (
            (
                await session.execute(
                    select(outbox.c.payload)
                    .where(outbox.c.key == "capability/refund")
                    .order_by(outbox.c.id)
                )
            )
            .scalars()
            .all()
        )
    assert [(f.event_type, f.tenant) for f in facts] == [
        ("capability.paused", "acme"), ("capability.resumed", "acme"),
    ]  # fmt: skip
    assert facts[0].actor["name"] == "oncall" and facts[0].reason == "provider down"
    assert [m["eventType"] for m in messages] == ["capability.paused", "capability.resumed"]
    for message in messages:
        schema = json.loads(
            (REPO / "docs/events/capability" / f"{message['eventType']}.json").read_text()
        )
        Draft202012Validator(schema, format_checker=FormatChecker()).validate(message)


async def test_an_unknown_capability_is_404(api: httpx.AsyncClient) -> None:
    reply = await api.post(
        "/v1/capabilities/nope/pause", json={"reason": "x"}, headers=bearer(OPERATOR)
    )
    assert reply.status_code == 404
    assert reply.json()["code"] == "capability_not_found"
