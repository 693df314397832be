"""Provider credentials are added at send time and never stored or logged (as text or
as JSON lines), on every path a send can take (success, not sent, not sendable, lost
answer, HTTP errors);
every request carries the call's stable Idempotency-Key and a traceparent."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.embedded import free_port
from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.tenancy import provider_key
from dispatcher.worker.executor import Executor
from tests.fixtures.calls import submit_call
from tests.fixtures.rows import (
    assert_no_secret_in_json,
    assert_secret_nowhere,
    call_row,
    table_dumps,
)
from tests.fixtures.sandbox import add_fault

pytestmark = pytest.mark.postgres

SECRET = "sk_live_do-not-leak-4f1c2e"


class RecordingProvider:
    """A real HTTP/1.1 server that remembers the headers it was sent."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> RecordingProvider:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        headers = dict(
            (k.strip().lower(), v.strip())
            for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:] if line)
        )
        await reader.readexactly(int(headers.get("content-length", "0")))
        self.headers.append(headers)
        body = json.dumps(
            {"externalRequestId": "ext-1", "status": "succeeded", "result": {"ok": True}}
        ).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n"
            b"connection: close\r\n\r\n" + body
        )
        await writer.drain()
        writer.close()


@pytest.fixture
async def provider() -> AsyncIterator[RecordingProvider]:
    async with RecordingProvider() as server:
        yield server


async def test_secret_is_sent_but_never_stored_or_logged(
    sessions: async_sessionmaker[AsyncSession],
    provider: RecordingProvider,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    registry = registry_of(capability("refund", provider.url))
    call = await submit_call(sessions, registry, "refund", {"orderId": "o-1"}, key="refund:o-1")
    async with Transport() as http:
        executor = Executor(
            sessions,
            registry,
            ProviderClient(http, {"refund": SECRET}),
            worker_id="w",
            topics=DEFAULT_TOPICS,
        )
        assert await executor.execute(call, "acme") is S.COMPLETED

    [sent] = provider.headers
    assert sent["authorization"] == f"Bearer {SECRET}"
    assert sent["idempotency-key"] == provider_key("acme", "refund:o-1")
    assert sent["traceparent"].startswith("00-") and len(sent["traceparent"]) == 55

    dumps = await table_dumps(sessions)
    assert {"tool_calls", "execution_events", "outbox"} <= set(dumps)
    for table, dump in dumps.items():
        assert SECRET not in dump, table
    # aiohttp logs nothing per request: a canary proves DEBUG lines were captured.
    logging.getLogger("dispatcher.provider").debug("canary")
    assert "canary" in caplog.text, "logging was captured"
    assert SECRET not in caplog.text
    assert_no_secret_in_json(caplog.records, SECRET)


# A fault on the first request, and the status it leaves the call in.
FAILURES: dict[str, tuple[dict[str, Any] | None, str]] = {
    "lost answer": ({"kind": "drop_after_apply"}, "result_unknown"),
    "read timeout": ({"kind": "timeout"}, "result_unknown"),
    "HTTP 500": ({"kind": "error", "status": 500}, "result_unknown"),
    "HTTP 409": ({"kind": "error", "status": 409}, "result_unknown"),
    "HTTP 422": ({"kind": "error", "status": 422}, "failed"),
    "not sent": (None, "failed"),
}


@pytest.mark.parametrize("path", list(FAILURES))
async def test_no_failure_path_stores_or_logs_the_secret(
    sessions: async_sessionmaker[AsyncSession],
    sandbox: SandboxServer,
    http: Transport,
    caplog: pytest.LogCaptureFixture,
    path: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    fault, status = FAILURES[path]
    # "not sent": nothing listens there, every attempt is refused.
    url = sandbox.url if fault else f"http://127.0.0.1:{free_port()}"
    registry = registry_of(capability("refund", url, timeout=0.3, attempts=2))
    if fault:
        await add_fault(sandbox.url, {**fault, "method": "POST", "times": 1})
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="refund:f-1")
    executor = Executor(
        sessions,
        registry,
        ProviderClient(http, {"refund": SECRET}),
        worker_id="w",
        topics=DEFAULT_TOPICS,
    )

    assert await executor.execute(call, "acme") is S(status)

    assert (await call_row(sessions, call))["last_error"]
    await assert_secret_nowhere(sessions, caplog, SECRET)


async def test_a_credential_that_cannot_be_sent_is_not_quoted(
    sessions: async_sessionmaker[AsyncSession],
    sandbox: SandboxServer,
    http: Transport,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A credential no header can carry: an HTTP library's errors quote the value; the
    recorded error names only the exception's type."""
    caplog.set_level(logging.DEBUG)
    registry = registry_of(capability("refund", sandbox.url))
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="refund:f-2")
    executor = Executor(
        sessions,
        registry,
        ProviderClient(http, {"refund": f"{SECRET}\r\nX-Injected: 1"}),
        worker_id="w",
        topics=DEFAULT_TOPICS,
    )

    assert await executor.execute(call, "acme") is S.FAILED

    assert "nothing was sent" in (await call_row(sessions, call))["last_error"]
    await assert_secret_nowhere(sessions, caplog, SECRET)
