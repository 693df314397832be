"""Ops endpoints of every long-running process but the API (which serves its own):
``/healthz``, ``/readyz`` and ``/metrics`` on a small aiohttp server.

The server runs on the process's own event loop, never in a thread: ``/healthz`` is
answered by a handler on that loop, so a loop blocked by a synchronous call (or a
stopped process) fails it, which a thread answering beside it could never show.
``/readyz`` runs the process's named checks (the database, the broker, a joined
consumer group...), each bounded by a short timeout, so a hung dependency makes the
probe fail quickly instead of hanging it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web
from aiokafka import AIOKafkaClient
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger(__name__)

# Each process kind's own port when ``ops_port`` is unset: distinct, so the processes
# of a deployment can run side by side on one host (the API has 8780, the sandbox
# provider itself 8790).
DEFAULT_PORTS = {
    "worker": 8781,
    "relay": 8782,
    "reconciler": 8783,
    "approvals": 8784,
    "bus-intake": 8786,
    "webhooks": 8787,
}
SANDBOX_PORT = 8785
# A check slower than this counts as failed: a probe must answer within its own timeout.
CHECK_TIMEOUT_SECONDS = 2.0

# A readiness check returns when the dependency is fine and raises otherwise; the
# exception's text is what /readyz reports.
Check = Callable[[], Awaitable[None]]


class NotReady(Exception):
    """A check's plain "no" (not joined yet, ...), reported by its message."""


class Ops:
    """The readiness checks of one process, by name; parts of the process add theirs
    as they start (the worker adds its consumer group's)."""

    def __init__(self) -> None:
        self.checks: dict[str, Check] = {}

    def add_check(self, name: str, check: Check) -> None:
        self.checks[name] = check

    async def readiness(self) -> dict[str, str]:
        """Every check's result, run together: ``"ok"`` or why it failed."""
        names = list(self.checks)
        results = await asyncio.gather(*(_run_check(self.checks[n]) for n in names))
        return dict(zip(names, results, strict=True))


async def _run_check(check: Check) -> str:
    try:
        await asyncio.wait_for(check(), CHECK_TIMEOUT_SECONDS)
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_SECONDS:g}s"
    # Any failure means "not ready": the probe reports it, never raises it.
    except Exception as exc:  # noqa: BLE001
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return "ok"


def database_check(engine: AsyncEngine) -> Check:
    async def check() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    return check


def broker_check(bootstrap: str) -> Check:
    """A fresh bootstrap (one metadata round trip) per probe: the process's own clients
    hide their connection state, and a probe's cost is negligible beside theirs."""

    async def check() -> None:
        client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=1500)
        try:
            await client.bootstrap()
        finally:
            await client.close()

    return check


def _app(ops: Ops) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        checks = await ops.readiness()
        failed = sorted(name for name, result in checks.items() if result != "ok")
        body: dict[str, object] = {"status": "not ready" if failed else "ready", "checks": checks}
        if failed:
            body["failed"] = failed
        return web.json_response(body, status=503 if failed else 200)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


@asynccontextmanager
async def serve_ops(
    ops: Ops, host: str, port: int, *, required: bool = True
) -> AsyncIterator[str | None]:
    """Serve the endpoints on ``host:port`` for the block; yields the base URL, or None
    when off (port 0). A taken port raises ``OSError`` unless not ``required`` (the
    process's default port, which a second process of its kind on the host already
    holds): then a warning, and the process runs without ops endpoints rather than not
    at all."""
    if port == 0:
        yield None
        return
    runner = web.AppRunner(_app(ops), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            if required:
                raise
            log.warning("ops port %s:%d not available (%s); ops endpoints off", host, port, exc)
            yield None
            return
        log.info("ops endpoints on http://%s:%d", host, port)
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
