"""The HTTP client against the real API (uvicorn on loopback), the real database and the
real sandbox provider; calls are driven to their outcome by a real executor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.client import ApiError, DispatcherClient, SyncDispatcherClient, WaitTimedOut
from dispatcher.client.problems import error_from
from dispatcher.errors import (
    ApprovalAlreadyDecided,
    IdempotencyKeyReused,
    RetryNotAllowed,
    RunStopped,
    ToolCallNotFound,
    Unauthenticated,
    ValidationFailed,
)
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.worker.executor import Executor
from tests.fixtures.api import ALICE, BOB, OPERATOR, bearer
from tests.fixtures.capabilities import approval_capability
from tests.fixtures.sandbox import at_provider, books
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        capability("send", sandbox.url),
        capability("lookup", sandbox.url, side_effects=False),
        approval_capability("refund-big", sandbox.url),
    )


@pytest.fixture
def base_url(api_url: str) -> str:
    return api_url


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[DispatcherClient]:
    async with DispatcherClient(base_url, ALICE) as c:
        yield c


@pytest.fixture
async def executor(
    sessions: async_sessionmaker[AsyncSession], registry: CapabilityRegistry
) -> AsyncIterator[Executor]:
    async with Transport() as http:
        yield Executor(
            sessions,
            registry,
            ProviderClient(http),
            worker_id="worker-a",
            topics=DEFAULT_TOPICS,
        )


def send(call_id: str, **fields: Any) -> SubmitRequest:
    return SubmitRequest(
        run_id=fields.pop("run_id", "run-1"),
        capability_id=fields.pop("capability_id", "send"),
        tool_call_id=call_id,
        input=fields.pop("input", {"to": "a@example.com"}),
        **fields,
    )


async def test_submit_with_own_tool_call_id_is_idempotent(client: DispatcherClient) -> None:
    first = await client.submit(send("run-1.toolu_01"))
    again = await client.submit(send("run-1.toolu_01"))

    assert first.created and not again.created
    assert first.view.tool_call_id == again.view.tool_call_id == "run-1.toolu_01"
    assert first.view.idempotency_key == "acme:run-1.toolu_01"  # qualified by its tenant
    assert (await client.get("run-1.toolu_01")).status == "authorized"


async def test_every_id_the_contract_allows_is_reachable(client: DispatcherClient) -> None:
    # "?", "#" and "%" are legal in ids; the client encodes them as path segments.
    tool_call_id = "tc?#%41x"
    await client.submit(send(tool_call_id, run_id="run?#%"))

    assert (await client.get(tool_call_id)).tool_call_id == tool_call_id
    with pytest.raises(ToolCallNotFound):
        await client.get("tc?")


async def test_wait_returns_the_recorded_outcome_once_settled(
    client: DispatcherClient, executor: Executor, sandbox: SandboxServer, engine: AsyncEngine
) -> None:
    await client.submit(send("tc-wait", input={"to": "b@example.com"}))
    # The API serves from this engine: its long-poll reads the call once per pause. One
    # read done before the executor starts saw the call unsettled, so the poll is held.
    polls: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "FROM tool_calls" in statement and "tc-wait" in str(parameters):
            polls.append(statement)

    event.listen(engine.sync_engine, "after_cursor_execute", seen)
    try:
        waiting = asyncio.create_task(client.wait("tc-wait", within=30))

        async def in_flight() -> bool:
            assert not waiting.done(), waiting
            return bool(polls)

        await eventually(in_flight, what="the long-poll to read the call")
    finally:
        event.remove(engine.sync_engine, "after_cursor_execute", seen)
    await executor.execute("tc-wait", "acme")

    view = await waiting
    assert view.status == "completed"
    assert view.result == {"echo": {"to": "b@example.com"}}
    # No key given: the stored one names the tenant, and the provider's names it again.
    assert (await books(sandbox.url))["effects"] == {at_provider("acme:tc-wait"): 1}


async def test_wait_times_out_with_the_last_state(client: DispatcherClient) -> None:
    await client.submit(send("tc-never"))

    with pytest.raises(WaitTimedOut) as caught:
        await client.wait("tc-never", within=0.3)
    assert caught.value.view.status == "authorized"
    assert caught.value.extra == {"toolCallId": "tc-never", "status": "authorized"}


async def test_wait_for_an_unknown_call_is_not_found(client: DispatcherClient) -> None:
    with pytest.raises(ToolCallNotFound) as caught:
        await client.wait("tc-missing", within=5)
    assert caught.value.code == "tool_call_not_found"
    assert caught.value.extra == {"toolCallId": "tc-missing"}


@pytest.mark.parametrize("value", ["-1", "21", "soon"])
async def test_long_poll_refuses_a_bad_wait(
    client: DispatcherClient, base_url: str, value: str
) -> None:
    await client.submit(send("tc-bad-wait"))
    async with httpx.AsyncClient() as http:
        response = await http.get(
            f"{base_url}/v1/tool-calls/tc-bad-wait",
            params={"waitSeconds": value},
            headers=bearer(ALICE),
        )
    assert response.status_code == 400
    assert response.json()["code"] == "validation_failed"
    assert isinstance(error_from(response), ValidationFailed)


async def test_errors_are_the_dispatchers_own_exceptions(
    client: DispatcherClient, base_url: str
) -> None:
    await client.submit(send("tc-key", idempotency_key="k-1"))
    with pytest.raises(IdempotencyKeyReused) as reused:
        await client.submit(send("tc-key-2", idempotency_key="k-1", input={"to": "other"}))
    assert reused.value.extra["idempotencyKey"] == "k-1"

    async with DispatcherClient(base_url, "tdk_wrong") as stranger:
        with pytest.raises(Unauthenticated):
            await stranger.get("tc-key")


async def test_approve_reject_stop_and_retry(
    client: DispatcherClient, base_url: str, executor: Executor
) -> None:
    big = await client.submit(send("tc-big", capability_id="refund-big", run_id="run-2"))
    other = await client.submit(send("tc-big-2", capability_id="refund-big", run_id="run-2"))
    assert big.view.status == other.view.status == "proposed"
    async with (
        DispatcherClient(base_url, BOB) as approver,
        DispatcherClient(base_url, OPERATOR) as operator,
    ):
        pending = {a["toolCallId"]: a["approvalId"] for a in await approvals(base_url)}
        approved = await approver.approve(pending["tc-big"], "checked")
        rejected = await approver.reject(pending["tc-big-2"], "too much")
        assert (approved.decision, rejected.decision) == ("approve", "reject")
        with pytest.raises(ApprovalAlreadyDecided):
            await approver.approve(pending["tc-big-2"])
        assert (await client.get("tc-big-2")).status == "rejected"

        with pytest.raises(RetryNotAllowed) as refused:
            await operator.retry("tc-big", "not failed yet")
        assert refused.value.extra["currentStatus"] == "authorized"

        queued = await client.submit(send("tc-queued", run_id="run-3"))
        stopped = await operator.stop_run("run-3", "wrong customer")
        assert stopped.cancelled == [queued.view.tool_call_id]
        assert not stopped.already_stopped and stopped.stopped_by == "oncall@acme (api)"
        with pytest.raises(RunStopped):
            await client.submit(send("tc-late", run_id="run-3"))

    await executor.execute("tc-big", "acme")
    assert (await client.wait("tc-big", within=30)).status == "completed"


async def test_retry_a_failed_call(
    client: DispatcherClient, base_url: str, executor: Executor
) -> None:
    await client.submit(send("tc-fails", input={"simulate": "fail"}))
    await executor.execute("tc-fails", "acme")
    assert (await client.wait("tc-fails", within=30)).status == "failed"

    async with DispatcherClient(base_url, OPERATOR) as operator:
        retried = await operator.retry("tc-fails", "provider fixed")

    assert retried.status == "authorized"
    assert retried.idempotency_key == "acme:tc-fails"


async def approvals(base_url: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient() as http:
        response = await http.get(
            f"{base_url}/v1/approvals", params={"status": "pending"}, headers=bearer(ALICE)
        )
    return list(response.json()["approvals"])


async def test_sync_client_outside_an_event_loop(base_url: str, executor: Executor) -> None:
    def producer() -> tuple[bool, bool, str]:
        with SyncDispatcherClient(base_url, ALICE) as sync:
            first = sync.submit(send("tc-sync"))
            again = sync.submit(send("tc-sync"))
            try:
                sync.get("tc-nope")
            except ToolCallNotFound:
                pass
            else:
                raise AssertionError("expected ToolCallNotFound")
            return first.created, again.created, sync.get("tc-sync").status

    assert await asyncio.to_thread(producer) == (True, False, "authorized")
    await executor.execute("tc-sync", "acme")

    def waiter() -> str:
        with SyncDispatcherClient(base_url, ALICE) as sync:
            return sync.wait("tc-sync", within=30).status

    assert await asyncio.to_thread(waiter) == "completed"


def test_unknown_codes_and_non_problem_answers_are_api_errors() -> None:
    newer = httpx.Response(409, json={"code": "brand_new", "detail": "d", "runId": "r"})
    page = httpx.Response(502, text="<html>bad gateway</html>")

    unknown, opaque = error_from(newer), error_from(page)

    assert isinstance(unknown, ApiError)
    assert (unknown.status, unknown.code, unknown.detail) == (409, "brand_new", "d")
    assert unknown.extra == {"runId": "r"}
    assert isinstance(opaque, ApiError)
    assert (opaque.status, opaque.code) == (502, "http_error")


def test_client_surface() -> None:
    import dispatcher.client

    assert sorted(dispatcher.client.__all__) == [
        "ApiError",
        "DispatcherClient",
        "StopResult",
        "SyncDispatcherClient",
        "WaitTimedOut",
    ]
