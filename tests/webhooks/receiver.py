"""A real webhook receiver on a local port: an aiohttp server that verifies every POST
with ``standardwebhooks.Webhook(secret).verify`` (as docs/webhooks.md tells receivers
to), answers 204 to what verifies and 400 to what does not, and can go down (its port
closed: connections refused) and come back on the same port."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from aiohttp import web
from standardwebhooks import Webhook
from standardwebhooks.exceptions import WebhookVerificationError


def new_secret() -> str:
    """A signing secret as Standard Webhooks prints one: ``whsec_`` + base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


@dataclass
class Received:
    webhook_id: str
    payload: dict[str, Any]
    raw: bytes
    headers: dict[str, str]


@dataclass
class Receiver:
    secret: str
    accepted: list[Received] = field(default_factory=list)
    refused: list[bytes] = field(default_factory=list)
    # The webhook-id of every POST, whatever the answer.
    seen: list[str] = field(default_factory=list)
    # 0: answer by verification; otherwise this status for every POST.
    answer: int = 0
    # When set, each POST waits for it before answering (a slow receiver).
    hold: asyncio.Event | None = None
    port: int = 0
    _runner: web.AppRunner | None = None
    _site: web.TCPSite | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _hook(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.seen.append(request.headers.get("webhook-id", ""))
        if self.hold is not None:
            await self.hold.wait()
        if self.answer:
            return web.Response(status=self.answer)
        try:
            Webhook(self.secret).verify(raw, dict(request.headers))
        except WebhookVerificationError:
            self.refused.append(raw)
            return web.Response(status=400)
        self.accepted.append(
            Received(request.headers["webhook-id"], json.loads(raw), raw, dict(request.headers))
        )
        return web.Response(status=204)

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = self.port or port_below_ephemeral()
        await self.up()
        return self

    async def up(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await self._site.start()

    async def down(self) -> None:
        """Close the port: from now on connections are refused."""
        assert self._site is not None
        await self._site.stop()

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    def ids(self) -> set[str]:
        return {r.webhook_id for r in self.accepted}


def port_below_ephemeral() -> int:
    """A free local port below the kernel's ephemeral range. A receiver that goes down
    gives its port up until it comes back; a port the kernel handed out (binding port 0)
    is in that range, so any process's outgoing connection may take it meanwhile as its
    local end, and coming back then fails with "address already in use" (seen once in
    CI, after a 30-second outage). Below the range only a process that binds that very
    port can take it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    for _ in range(100):
        port = random.randrange(10_000, low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port between 10000 and {low}")
