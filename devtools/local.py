"""The local stack behind `python -m devtools up` and the demo: whatever the settings
leave unconfigured is started embedded (PostgreSQL, Tansu), the schema is migrated,
and every long-running part of the service runs in one process: the API, the outbox
relay, a worker, the reconciler loop and the approval sweeper. Production runs each as
its own process instead."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import outbox_relay
from devtools.embedded import EmbeddedPostgres, Tansu
from devtools.sandbox import SandboxServer
from devtools.sandbox.command import DEFAULT_PORT
from dispatcher.api.server import api_server, wait_started
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db import migrate
from dispatcher.relay_process import relay_config
from dispatcher.settings import ApiKey, Settings, hash_api_key
from dispatcher.topics import ensure_topics
from dispatcher.worker.consumer import run_worker
from kit.signals import until_signal
from tool_dispatcher.approvals import run_service as approvals_service
from tool_dispatcher.reconcile import run_service as reconciler_service

DEV_TENANT = "dev"
"""The tenant of the development API key a stack without API keys gets."""


@dataclass
class Stack:
    settings: Settings
    dev_api_key: str | None = None
    started: list[str] = field(default_factory=list)


@asynccontextmanager
async def local_stack(settings: Settings) -> AsyncIterator[Stack]:
    """Yield a :class:`Stack` whose settings name a migrated database and a broker."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    pg: EmbeddedPostgres | None = None
    broker: Tansu | None = None
    updates: dict[str, object] = {}
    started: list[str] = []
    try:
        if settings.database_url is None:
            pg = EmbeddedPostgres(settings.state_dir.resolve() / "pgdata")
            updates["database_url"] = await asyncio.to_thread(pg.start)
            started.append(f"embedded PostgreSQL  {updates['database_url']}")
        if settings.kafka_bootstrap is None:
            broker = Tansu(log_file=settings.state_dir / "tansu.log")
            updates["kafka_bootstrap"] = await asyncio.to_thread(broker.start)
            # Tansu rejects the idempotent producer.
            updates["kafka_enable_idempotence"] = False
            started.append(f"embedded Tansu       {updates['kafka_bootstrap']} (memory only)")
        if "console_secure_cookie" not in settings.model_fields_set:
            # `up` serves plain http on loopback, where a Secure cookie is never sent.
            updates["console_secure_cookie"] = False
        dev_key = None
        if not settings.api_keys:
            dev_key = _dev_api_key(settings)
            updates["api_keys"] = [
                ApiKey(sha256=hash_api_key(dev_key), tenant=DEV_TENANT, name="dev")
            ]
        resolved = settings.model_copy(update=updates)
        await migrate.upgrade_async(resolved.database_url or "")
        yield Stack(resolved, dev_key, started)
    finally:
        if broker is not None:
            await asyncio.to_thread(broker.stop)
        if pg is not None:
            await asyncio.to_thread(pg.stop)


def _dev_api_key(settings: Settings) -> str:
    """A per-checkout development key, kept in the state directory."""
    path = settings.state_dir / "dev-api-key"
    if path.exists():
        return path.read_text().strip()
    key = "dev_" + secrets.token_urlsafe(24)
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


log = logging.getLogger(__name__)
Service = Callable[[Settings, CapabilityRegistry, asyncio.Event], Coroutine[None, None, None]]
# The services beside the API, relay and worker, as their commands run them.
SERVICES: dict[str, Service] = {"reconciler": reconciler_service, "approvals": approvals_service}


@asynccontextmanager
async def all_services(
    settings: Settings, registry: CapabilityRegistry, *, port: int | None = None
) -> AsyncIterator[list[str]]:
    """Run everything until the block exits; yields one line per running part."""
    stop = asyncio.Event()
    await ensure_topics(settings)
    server = api_server(settings, registry, port=port, install_signal_handlers=False)
    tasks = {"api": asyncio.create_task(server.serve())}
    await wait_started(server, tasks["api"])
    tasks["relay"] = asyncio.create_task(outbox_relay.run_relay(relay_config(settings), stop))
    tasks["worker"] = asyncio.create_task(run_worker(settings, registry, stop))
    for name, service in SERVICES.items():
        tasks[name] = asyncio.create_task(service(settings, registry, stop))
    base = f"http://{settings.http_host}:{server.config.port}"
    lines = [f"{'API':<21} {base}", f"{'console':<21} {base}/console/"]
    # Everything runs in this one process, so the API's probes are every part's: no
    # ops server of their own (their default ports would collide with a real one's).
    ops = f"ops {base}/healthz /readyz /metrics"
    lines += [f"{name:<21} running, {ops}" for name in tasks if name != "api"]
    try:
        yield lines
    finally:
        stop.set()
        server.should_exit = True
        for name, task in tasks.items():
            try:
                await asyncio.wait_for(task, 15)
            except TimeoutError:
                log.warning("%s did not stop in time", name)
            except Exception:  # one part's failure must not keep the others running
                log.exception("%s failed", name)
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task


async def run_up(settings: Settings, registry: CapabilityRegistry, *, sandbox: bool) -> int:
    """`python -m devtools up`: everything until SIGTERM/SIGINT. ``sandbox`` starts the
    sandbox provider on its default port, where the sandbox registry points."""
    await until_signal(lambda stop: _up(settings, registry, stop, sandbox=sandbox))
    print("stopped")
    return 0


async def _up(
    settings: Settings, registry: CapabilityRegistry, stop: asyncio.Event, *, sandbox: bool
) -> None:
    """The stack and every service on it, with the lines saying where, until ``stop``."""
    async with local_stack(settings) as stack:
        s = stack.settings
        provider = SandboxServer(port=DEFAULT_PORT) if sandbox else None
        if provider is not None:
            await provider.start()
        try:
            async with all_services(s, registry) as lines:
                print("tool-dispatcher is up")
                for line in stack.started:
                    print(f"  {line}")
                if provider is not None:
                    print(f"  sandbox provider      {provider.url} (ops: the API's)")
                print(f"  database              {s.database_url}")
                print(f"  kafka                 {s.kafka_bootstrap}")
                for line in lines:
                    print(f"  {line}")
                if stack.dev_api_key:
                    key = stack.dev_api_key
                    print(f"  dev API key (tenant 'dev', signs in to the console): {key}")
                print("Ctrl-C stops everything.", flush=True)
                await stop.wait()
        finally:
            if provider is not None:
                await provider.stop()
