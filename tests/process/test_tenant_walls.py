"""One tenant's dead letters hold back nothing of another's, on the real relay, broker,
worker and API: tenant A's escalation, too large for the broker, stands dead-lettered
under A's run and call ids, while tenant B, using the very same ids, gets its calls
done and its events published. B sees none of A's dead letters, cannot touch them,
and A's discard releases nothing of B's, because nothing of B's was held."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.embedded import free_port, wait_for_port
from devtools.sandbox import SandboxServer
from dispatcher.db.tables import outbox, tool_calls
from dispatcher.settings import hash_api_key
from dispatcher.tenancy import ordering_key
from tests.fixtures.calls import make_due
from tests.fixtures.relay import TopicReader
from tests.fixtures.sandbox import add_fault, at_provider
from tests.fixtures.stack import MakeStack, ProcessStack
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]

Sessions = async_sessionmaker[AsyncSession]
KEYS = {"acme": "tdk_walls_acme", "globex": "tdk_walls_globex"}


@pytest.fixture
def stack(make_stack: MakeStack, sandbox: SandboxServer) -> ProcessStack:
    keys = [
        {"sha256": hash_api_key(raw), "tenant": tenant, "scopes": ["submit", "read", "operate"]}
        for tenant, raw in KEYS.items()
    ]
    return make_stack(
        sandbox_url=sandbox.url,
        http_port=free_port(),
        api_keys=json.dumps(keys),
        # A's escalation carries its 90 KB input: the broker never takes it.
        relay__max_message_bytes=65536,
    )


def client(stack: ProcessStack, tenant: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.env['TOOL_DISPATCHER_HTTP_PORT']}",
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout=30,
    )


async def statuses(sessions: Sessions, tenant: str) -> dict[str, str]:
    async with sessions() as session:
        rows = await session.execute(
            select(tool_calls.c.tool_call_id, tool_calls.c.status).where(
                tool_calls.c.tenant == tenant
            )
        )
        return dict(rows.all())


async def dead_letters_of(sessions: Sessions, tenant: str) -> list[int]:
    async with sessions() as session:
        ids = await session.scalars(
            select(outbox.c.id).where(
                outbox.c.dead_lettered_at.is_not(None), outbox.c.payload["tenant"].astext == tenant
            )
        )
        return list(ids)


async def unpublished_of(sessions: Sessions, tenant: str) -> int:
    async with sessions() as session:
        count = await session.scalar(
            select(func.count()).where(
                outbox.c.published_at.is_(None), outbox.c.payload["tenant"].astext == tenant
            )
        )
        return int(count or 0)


async def escalate_a(stack: ProcessStack, sessions: Sessions, sandbox: SandboxServer) -> list[int]:
    """Tenant A's call ``tc-shared`` in run ``run-1``, its answer lost, escalated by the
    reconciler with its 90 KB input, which the relay dead-letters; A's dead letters."""
    await add_fault(
        sandbox.url, {"kind": "drop_after_apply", "idempotencyKey": at_provider("k-a", "acme")}
    )
    async with client(stack, "acme") as acme:
        answer = await acme.post(
            "/v1/tool-calls",
            json={
                "runId": "run-1",
                "toolCallId": "tc-shared",
                "capabilityId": "refund",
                "idempotencyKey": "k-a",
                "input": {"note": "x" * 90_000},
            },
        )
    assert answer.status_code == 201, answer.text

    async def unknown() -> bool:
        return (await statuses(sessions, "acme")).get("tc-shared") == "result_unknown"

    await eventually(unknown, within=60, what="A's call to be in doubt")
    await make_due(sessions)
    settled = await asyncio.to_thread(stack.run, "reconcile", "--once")
    assert settled.returncode == 0, settled.stderr

    async def dead() -> bool:
        return bool(await dead_letters_of(sessions, "acme"))

    await eventually(dead, within=60, what="A's escalation to be dead-lettered")
    return await dead_letters_of(sessions, "acme")


async def test_one_tenants_dead_letters_hold_back_nothing_of_anothers(
    stack: ProcessStack, sessions: Sessions, sandbox: SandboxServer
) -> None:
    stack.start("serve")
    await asyncio.to_thread(
        wait_for_port, "127.0.0.1", int(stack.env["TOOL_DISPATCHER_HTTP_PORT"]), timeout=60
    )
    stack.start("relay")
    stack.start("worker")
    a_dead = await escalate_a(stack, sessions, sandbox)
    assert (await statuses(sessions, "acme"))["tc-shared"] == "escalated"

    # B, with A's run id and A's toolCallId (and a call named like A's run).
    b_calls = {"tc-shared": "k-b1", "run-1": "k-b2"}
    async with client(stack, "globex") as globex:
        for call, key in b_calls.items():
            sent = await globex.post(
                "/v1/tool-calls",
                json={
                    "runId": "run-1",
                    "toolCallId": call,
                    "capabilityId": "refund",
                    "idempotencyKey": key,
                    "input": {"n": 1},
                },
            )
            assert sent.status_code == 201, sent.text

        async def b_done() -> bool:
            return await statuses(sessions, "globex") == dict.fromkeys(b_calls, "completed")

        await eventually(b_done, within=60, what="B's calls to complete past A's dead letters")
        events = stack.env["TOOL_DISPATCHER_EVENTS_TOPIC"]
        async with TopicReader(stack.env["TOOL_DISPATCHER_KAFKA_BOOTSTRAP"], events) as reader:
            b_run = ordering_key("globex", "run-1")
            # requested, authorized, completed for each of B's two calls (the claim's
            # tool.call.dispatching is in the log only).
            await reader.until(lambda ms: sum(m.key == b_run for m in ms) >= 6, within=30)
        assert await unpublished_of(sessions, "globex") == 0

        # B sees none of A's dead letters and can touch none of them.
        listed = await globex.get("/v1/outbox/dead-letters")
        assert listed.status_code == 200 and listed.json()["deadLetters"] == []
        for action in ("retry", "discard"):
            refused = await globex.post(
                f"/v1/outbox/dead-letters/{a_dead[0]}/{action}", json={"confirm": True}
            )
            assert refused.status_code == 404, refused.text
            assert refused.json()["code"] == "dead_letter_not_found"
    assert await dead_letters_of(sessions, "acme") == a_dead

    # A sees its own, and its discard releases nothing of B's: nothing of B's waits.
    async with client(stack, "acme") as acme:
        mine = await acme.get("/v1/outbox/dead-letters")
        assert [d["id"] for d in mine.json()["deadLetters"]] == a_dead
        for row_id in a_dead:
            gone = await acme.post(
                f"/v1/outbox/dead-letters/{row_id}/discard", json={"confirm": True}
            )
            assert gone.status_code == 200, gone.text
    assert await dead_letters_of(sessions, "acme") == []
    assert await unpublished_of(sessions, "globex") == 0
