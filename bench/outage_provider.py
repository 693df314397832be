"""The provider of ``bench.outage``: the sandbox behind a proxy that can be down in
three ways, counting what reached it while down."""

from __future__ import annotations

import asyncio
import time

import httpx

from devtools.chaos.proxy import ProxyMode, TcpProxy
from devtools.sandbox import SandboxServer


class Provider:
    """The sandbox behind a proxy, down in one of three ways (``--down``):

    - ``refuse``: nothing listens (connection refused: provably not sent);
    - ``reset``: connections are accepted and reset at once (a request may have left);
    - ``503``: the provider answers ``503`` with ``Retry-After: 1`` to everything.

    It counts what reached it while down: refused connections cannot be counted (nothing
    is there to count them), reset ones and 503s are."""

    def __init__(self, sandbox: SandboxServer, down: str) -> None:
        upstream = httpx.URL(sandbox.url)
        self.sandbox_url = sandbox.url
        self.down = down
        self.proxy = _CountingProxy(upstream.host, upstream.port or 80)
        self.reached: int | None = None if down == "refuse" else 0
        self.recovered_at = 0.0
        self._received_before = 0

    async def fail(self) -> None:
        if self.down == "refuse":
            await self.proxy.close_listener()
        elif self.down == "reset":
            self.proxy.set_mode(ProxyMode.CUT)
        else:
            self._received_before = await self._received()
            await self._sandbox("POST", {"kind": "error", "status": 503, "retryAfter": 1})

    async def recover(self) -> None:
        self.recovered_at = time.monotonic()
        if self.down == "refuse":
            await self.proxy.start()
        elif self.down == "reset":
            self.proxy.set_mode(ProxyMode.PASS)
            self.reached = self.proxy.refused
        else:
            await self._sandbox("DELETE", None)
            self.reached = await self._received() - self._received_before

    async def _received(self) -> int:
        async with httpx.AsyncClient(base_url=self.sandbox_url) as client:
            books = (await client.get("/v1/effects")).json()
        return sum(books["received"].values())

    async def _sandbox(self, method: str, rule: dict[str, object] | None) -> None:
        async with httpx.AsyncClient(base_url=self.sandbox_url) as client:
            (await client.request(method, "/v1/faults", json=rule)).raise_for_status()


class _CountingProxy(TcpProxy):
    """The proxy, counting the connections it resets while cut, and able to stop
    listening (and listen again on the same port)."""

    refused = 0

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode is ProxyMode.CUT:
            self.refused += 1
        await super()._accept(reader, writer)

    async def close_listener(self) -> None:
        self._requested_port = self.port
        await self.stop()
