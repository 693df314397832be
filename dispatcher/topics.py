"""Creating the service's topics before anyone consumes them (a consumer subscribed to
a missing topic would only notice it at its next metadata refresh)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from dispatcher.settings import Settings

log = logging.getLogger(__name__)

_RETRY_CAP_SECONDS = 5.0


def wanted_topics(settings: Settings) -> list[str]:
    """Every topic the service writes or reads with ``settings``: what
    :func:`ensure_topics` makes."""
    wanted = [settings.dispatch_topic, settings.events_topic, settings.escalations_topic]
    # Bus intake's: each request topic, its replies (which the relay publishes) and its
    # dead letters. In production they are KafkaTopic resources (deploy/), made first.
    for route in settings.bus.routes().values():
        wanted += [route.topic, route.replies, route.dead_letters]
    return wanted


async def ensure_topics(settings: Settings) -> None:
    if settings.kafka_bootstrap is None:
        raise ValueError("no Kafka configured (TOOL_DISPATCHER_KAFKA_BOOTSTRAP)")
    wanted = wanted_topics(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        missing = [t for t in wanted if t not in existing]
        if missing:
            try:
                await admin.create_topics(
                    [NewTopic(t, settings.topic_partitions, 1) for t in missing]
                )
            except TopicAlreadyExistsError:
                pass  # another process created it first
    finally:
        await admin.close()


async def ensure_topics_when_reachable(settings: Settings, stop: asyncio.Event) -> bool:
    """:func:`ensure_topics`, waiting for a broker that cannot be reached yet; False if
    ``stop`` came first.

    A worker or relay (re)started while the broker is down or restarting waits for it
    instead of exiting: a supervisor restarting it in a loop would only add noise. And
    a relay that found the topics missing would dead-letter every row it read, so it
    creates them before publishing anything, as the worker does.
    """
    delay = 0.25
    while not stop.is_set():
        try:
            await ensure_topics(settings)
            return True
        except KafkaError as exc:
            delay = min(delay * 2, _RETRY_CAP_SECONDS)
            log.warning(
                "Kafka at %s not reachable (%s); trying again in %.1fs",
                settings.kafka_bootstrap,
                type(exc).__name__,
                delay,
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
    return False
