"""`tool-dispatcher worker`: consume dispatch commands and execute them.

Offsets are committed only after the database recorded each command's outcome; a
command seen twice is dropped by the call's state (only an ``authorized`` call can be
claimed). Every worker also runs the recovery sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.crashpoints import CrashPoints
from dispatcher.db import create_engine, session_factory
from dispatcher.execution import Executor
from dispatcher.kafka_topics import ensure_topics
from dispatcher.provider import ProviderClient
from dispatcher.recovery import recover_expired
from dispatcher.settings import Settings

log = logging.getLogger(__name__)


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def command_tool_call_id(record: ConsumerRecord[Any, Any]) -> str | None:
    """The call a dispatch command names, or None for a message that is not one."""
    try:
        payload = json.loads(record.value)
    except (TypeError, ValueError):
        return None
    tool_call_id = payload.get("toolCallId") if isinstance(payload, dict) else None
    return tool_call_id if isinstance(tool_call_id, str) and tool_call_id else None


async def run_worker(
    settings: Settings,
    registry: CapabilityRegistry,
    stop: asyncio.Event,
    *,
    worker_id: str | None = None,
) -> None:
    """Consume until ``stop`` is set; calls in flight finish and are recorded first."""
    worker_id = worker_id or new_worker_id()
    engine = create_engine(settings)
    sessions = session_factory(engine)
    http = httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=settings.provider_max_connections,
            max_keepalive_connections=settings.provider_max_connections,
            # Shorter than a provider's idle timeout, so a pooled
            # connection is not reused just as the server closes it.
            keepalive_expiry=2.0,
        ),
        follow_redirects=False,
    )
    executor = Executor(
        sessions,
        registry,
        ProviderClient(
            http, settings.provider_credentials(), max_in_flight=settings.provider_max_connections
        ),
        worker_id=worker_id,
        events_topic=settings.events_topic,
        min_lease_seconds=settings.min_lease_seconds,
        lease_margin_seconds=settings.lease_margin_seconds,
        crash=CrashPoints(settings.crash_at),
    )
    await ensure_topics(settings)
    consumer = AIOKafkaConsumer(
        settings.dispatch_topic,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=settings.worker_group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
        max_poll_records=settings.worker_concurrency,
        session_timeout_ms=settings.kafka_session_timeout_ms,
        heartbeat_interval_ms=max(300, settings.kafka_session_timeout_ms // 4),
    )
    await consumer.start()
    sweeper = asyncio.create_task(_sweep(settings, registry, sessions, stop))
    limit = asyncio.Semaphore(settings.worker_concurrency)

    async def handle(record: ConsumerRecord[Any, Any]) -> None:
        tool_call_id = command_tool_call_id(record)
        if tool_call_id is None:
            log.error(
                "dropping a message that is not a dispatch command at %s:%s@%s",
                record.topic,
                record.partition,
                record.offset,
            )
            return
        async with limit:
            await executor.execute(tool_call_id)

    log.info("worker %s consuming %s", worker_id, settings.dispatch_topic)
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200)
            if batches:
                await _process(consumer, batches, handle)
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper
        await consumer.stop()
        await http.aclose()
        await engine.dispose()


async def _process(
    consumer: AIOKafkaConsumer,
    batches: dict[TopicPartition, list[ConsumerRecord[Any, Any]]],
    handle: Any,
) -> None:
    """Handle every fetched command concurrently, then commit all offsets at once."""
    records = [r for rs in batches.values() for r in rs]
    results = await asyncio.gather(*(handle(r) for r in records), return_exceptions=True)
    failed_at: dict[TopicPartition, int] = {}
    for record, result in zip(records, results, strict=True):
        if isinstance(result, BaseException):
            tp = TopicPartition(record.topic, record.partition)
            failed_at[tp] = min(failed_at.get(tp, record.offset), record.offset)
            log.warning("command at %s@%d failed: %s", tp, record.offset, type(result).__name__)
    offsets = {
        tp: OffsetAndMetadata(failed_at.get(tp, rs[-1].offset + 1), "")
        for tp, rs in batches.items()
        if failed_at.get(tp, rs[-1].offset + 1) > rs[0].offset
    }
    if offsets:
        await consumer.commit(offsets)
    # The database did not take some outcome: replay each such partition from its first
    # failure (the commands after it that did succeed are dropped by their state).
    for tp, offset in failed_at.items():
        consumer.seek(tp, offset)
    if failed_at:
        await asyncio.sleep(1.0)


async def _sweep(
    settings: Settings, registry: CapabilityRegistry, sessions: Any, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            await recover_expired(
                sessions,
                registry,
                dispatch_topic=settings.dispatch_topic,
                events_topic=settings.events_topic,
            )
        except Exception:  # the sweep must outlive a database outage
            log.exception("recovery sweep failed; trying again")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.recovery_interval_seconds)
