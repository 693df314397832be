"""Every long-running part of the service in one process, for `tool-dispatcher up` and
the demo: the API, the outbox relay, a worker, and the services that packages above
the dispatcher add through the ``tool_dispatcher.services`` entry-point group (the
reconciler loop). Production runs each as its own process instead."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from importlib.metadata import entry_points

import outbox_relay
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.kafka_topics import ensure_topics, ensure_topics_when_reachable
from dispatcher.serving import api_server, wait_started
from dispatcher.settings import Settings
from dispatcher.worker import run_worker

log = logging.getLogger(__name__)
SERVICES_GROUP = "tool_dispatcher.services"
Service = Callable[[Settings, CapabilityRegistry, asyncio.Event], Coroutine[None, None, None]]


def relay_config(settings: Settings) -> outbox_relay.RelayConfig:
    if settings.database_url is None or settings.kafka_bootstrap is None:
        raise ValueError("the relay needs a database and a Kafka bootstrap")
    return outbox_relay.RelayConfig(
        database_url=settings.database_url,
        kafka_bootstrap=settings.kafka_bootstrap,
        enable_idempotence=settings.kafka_enable_idempotence,
    )


async def run_relay_process(
    settings: Settings, config: outbox_relay.RelayConfig, stop: asyncio.Event
) -> None:
    """`tool-dispatcher relay`: the service's topics first (waiting for the broker if
    need be: a relay that found them missing would dead-letter its rows), then the
    relay until ``stop``."""
    if await ensure_topics_when_reachable(settings, stop):
        await outbox_relay.run_relay(config, stop)


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
    for plugin in entry_points(group=SERVICES_GROUP):
        service: Service = plugin.load()
        tasks[plugin.name] = asyncio.create_task(service(settings, registry, stop))
    lines = [f"{'API':<21} http://{settings.http_host}:{server.config.port}"]
    lines += [f"{name:<21} running" for name in tasks if name != "api"]
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
