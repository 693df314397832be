"""`tool-dispatcher worker`: consume dispatch commands and execute them.

Each fetch is executed as one batch (one claim transaction, the requests in flight
together, one record transaction: see :mod:`dispatcher.worker.executor`), and its offsets
are committed only after the database recorded the batch's outcomes; a command seen
twice is dropped by the call's state (only an ``authorized`` call can be claimed).
Every worker also runs the recovery sweep and, less often, re-drives calls whose
dispatch command the broker lost (:mod:`dispatcher.worker.redrive`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError
from aiokafka.structs import OffsetAndMetadata
from opentelemetry import trace
from opentelemetry.trace import Span

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.ledger.messages import DispatchCommand
from dispatcher.metrics import CONSUMER_LAG
from dispatcher.ops import NotReady, Ops
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.contract import Credentials
from dispatcher.provider.transport import Transport
from dispatcher.settings import Settings
from dispatcher.topics import ensure_topics_when_reachable
from dispatcher.worker import spans
from dispatcher.worker.breakers import Breakers
from dispatcher.worker.crashpoints import CrashPoints
from dispatcher.worker.executor import Executor
from dispatcher.worker.recovery import recover_expired
from dispatcher.worker.redrive import redrive_resumed, redrive_stale
from kit import telemetry
from kit.kafka import stop_consumer
from kit.owners import owner_id
from kit.periodic import periodic

log = logging.getLogger(__name__)

RECOVERY_LOOP, REDRIVE_LOOP, RESUME_LOOP = "recovery", "redrive", "resume"
BREAKER_LOOP = "breaker"
"""The ``loop`` labels of the sweeps' step metrics, and the names in their logs."""


def default_provider(settings: Settings, transport: Transport) -> ProviderClient:
    return ProviderClient(transport, Credentials.configured(settings))


async def run_worker(
    settings: Settings,
    registry: CapabilityRegistry,
    stop: asyncio.Event,
    *,
    worker_id: str | None = None,
    provider: ProviderClient | None = None,
    ops: Ops | None = None,
) -> None:
    """Consume until ``stop`` is set; calls in flight finish and are recorded first.

    ``provider`` is the client that sends calls (its owner closes it); by default one
    built from the settings, closed here. ``ops`` gets the "consumer group" readiness
    check, failing from now (a worker still waiting for the broker) until joined."""
    worker_id = worker_id or owner_id("worker")
    membership = GroupMembership(settings.worker_group_id)
    if ops is not None:
        ops.add_check("consumer group", membership.check)
    if not await ensure_topics_when_reachable(settings, stop):
        return
    engine = create_engine(settings)
    sessions = session_factory(engine)
    # One transport per process (opened on first send); a provider handed in brings its
    # own.
    transport: Transport | None = None
    if provider is None:
        transport = Transport(settings.provider_max_connections)
        provider = default_provider(settings, transport)
    breakers = Breakers(sessions, registry, topics=settings.topics())
    executor = Executor(
        sessions,
        registry,
        provider.guarded(breakers),
        worker_id=worker_id,
        topics=settings.topics(),
        min_lease_seconds=settings.min_lease_seconds,
        lease_margin_seconds=settings.lease_margin_seconds,
        crash=CrashPoints(settings.crash_at),
        concurrency=settings.worker_concurrency,
    )
    consumer = build_consumer(settings, executor.longest_batch_seconds(settings.worker_batch_size))
    consumer.subscribe([settings.dispatch_topic], listener=membership)
    await consumer.start()
    sweeper = asyncio.create_task(_sweep(settings, registry, sessions, stop, (breakers, executor)))
    known = {cap.id for cap in registry}
    log.info("worker %s consuming %s", worker_id, settings.dispatch_topic)
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200)
            observe_lag(consumer, batches)
            if batches:
                await _process(consumer, batches, executor, known, settings.worker_group_id)
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper
        await stop_consumer(consumer)
        if transport is not None:
            await transport.close()
        await engine.dispose()


class GroupMembership(ConsumerRebalanceListener):  # type: ignore[misc]
    """Whether this worker is a member of its consumer group right now: joined once
    the group assigned it its partitions (none, when the group has more members than
    partitions: still joined), not joined while a rebalance is under way."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.joined = False

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.joined = False

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.joined = True

    async def check(self) -> None:
        if not self.joined:
            raise NotReady(f"not joined to consumer group {self.group}")


_LAGGING: set[int] = set()
"""Partitions this process has set a lag for (to clear those it no longer holds)."""


def build_consumer(settings: Settings, longest_batch_seconds: float) -> AIOKafkaConsumer:
    """The worker's consumer of commands: offsets committed by hand, after the batch."""
    return AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=settings.worker_group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
        max_poll_records=settings.worker_batch_size,
        # A batch is processed between two fetches: a slow provider must not get the
        # worker taken out of the group (aiokafka's default is 300 s; a batch of 500
        # at 64 in flight with the default retry policy may take 560).
        max_poll_interval_ms=int(1000 * (longest_batch_seconds + 30)),
        session_timeout_ms=settings.kafka_session_timeout_ms,
        heartbeat_interval_ms=max(300, settings.kafka_session_timeout_ms // 4),
        metadata_max_age_ms=settings.kafka_metadata_max_age_ms,
    )


def observe_lag(
    consumer: AIOKafkaConsumer, batches: dict[TopicPartition, list[ConsumerRecord[Any, Any]]]
) -> None:
    """Set the lag of each partition a fetch returned records of: its high watermark
    (as the fetch response told it) minus the offset after the last record fetched.
    Called right after the fetch, before any await. A partition given away drops its
    series, so the workers' lags can be summed."""
    held = {tp.partition for tp in consumer.assignment()}
    for partition in _LAGGING - held:
        CONSUMER_LAG.remove(str(partition))
        _LAGGING.discard(partition)
    for tp, records in batches.items():
        # highwater() asserts the partition is held: a metric must never stop the loop.
        highwater = consumer.highwater(tp) if tp.partition in held else None
        if highwater is not None and records:
            CONSUMER_LAG.labels(str(tp.partition)).set(max(0, highwater - records[-1].offset - 1))
            _LAGGING.add(tp.partition)


def _commands(
    records: list[ConsumerRecord[Any, Any]], known: set[str]
) -> list[tuple[ConsumerRecord[Any, Any], DispatchCommand]]:
    """The commands the fetched records carry, in order; other messages are dropped."""
    commands = []
    for record in records:
        command = DispatchCommand.parse(record.value, record.headers)
        if command is None:
            log.error(
                "dropping a message that is not a dispatch command at %s:%s@%s",
                record.topic,
                record.partition,
                record.offset,
            )
            continue
        if command.capability_id not in known:
            # Its call stays authorized: no claim is taken for an unknown capability.
            log.error("call %s names an unregistered capability", command.tool_call_id)
        commands.append((record, command))
    return commands


def _spans(
    commands: list[tuple[ConsumerRecord[Any, Any], DispatchCommand]], group: str
) -> dict[tuple[str, str], Span]:
    """A consume span per call of the batch (a call's repeated command adds none)."""
    found: dict[tuple[str, str], Span] = {}
    for record, command in commands:
        key = (command.tenant, command.tool_call_id)
        if key not in found:
            found[key] = spans.consume_span(record, command, group)
    return found


async def _process(
    consumer: AIOKafkaConsumer,
    batches: dict[TopicPartition, list[ConsumerRecord[Any, Any]]],
    executor: Executor,
    known: set[str],
    group: str = "",
) -> None:
    """Execute every fetched command as one batch, then commit all offsets at once."""
    records = [r for rs in batches.values() for r in rs]
    commands = _commands(records, known)
    traced = _spans(commands, group) if telemetry.enabled() else {}
    parents = {key: trace.set_span_in_context(span) for key, span in traced.items()}
    try:
        statuses = await executor.execute_many(
            [(c.tenant, c.tool_call_id) for _, c in commands], parents
        )
    except Exception as exc:  # the database did not take the batch: replay it
        spans.end_consume_spans(traced, {}, exc)
        log.exception("batch of %d commands failed; replaying it", len(records))
        # Each partition from its first record; commands that did succeed are then
        # dropped by their state.
        for tp, rs in batches.items():
            consumer.seek(tp, rs[0].offset)
        await asyncio.sleep(1.0)
        return
    spans.end_consume_spans(traced, statuses)
    await commit_recorded(
        consumer, {tp: OffsetAndMetadata(rs[-1].offset + 1, "") for tp, rs in batches.items()}
    )


async def commit_recorded(
    consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, OffsetAndMetadata]
) -> None:
    """Commit a recorded batch's offsets, unless the group rebalanced meanwhile.

    A lost commit costs nothing: the outcomes are already in the database, so the
    partitions' new owner is redelivered the batch's commands and drops them by the
    calls' state. Exiting instead would only trigger another rebalance.
    """
    try:
        await consumer.commit(offsets)
    except CommitFailedError:
        # The broker refused this member's stale generation (aiokafka reports
        # RebalanceInProgress, IllegalGeneration and UnknownMemberId as this).
        log.warning(
            "offsets of a recorded batch not committed: the group rebalanced; "
            "its commands will be redelivered and dropped by their state"
        )
    except IllegalStateError as exc:
        # The rebalance already completed here and took (some of) the partitions away.
        log.warning("offsets of a recorded batch not committed: %s", exc)


async def _sweep(
    settings: Settings,
    registry: CapabilityRegistry,
    sessions: Any,
    stop: asyncio.Event,
    gated: tuple[Breakers, Executor],
) -> None:
    """The worker's sweeps, each its own loop so one failing does not hold the others
    back: recovery at once and then every ``recovery_interval_seconds``, redrive every
    ``redrive_interval_seconds`` from one interval after the start, the calls of a
    capability just resumed and the circuit breakers' probes every
    ``recovery_interval_seconds``."""
    topics = settings.topics()
    known = {cap.id for cap in registry}

    async def recover() -> None:
        await recover_expired(sessions, registry, topics=topics)

    async def redrive() -> None:
        await redrive_stale(
            sessions,
            topics=topics,
            older_than_seconds=settings.redrive_after_seconds,
            known_capabilities=known,
        )

    async def resume() -> None:
        await redrive_resumed(
            sessions,
            topics=topics,
            older_than_seconds=settings.redrive_after_seconds,
            known_capabilities=known,
        )

    async def probe() -> None:
        breakers, executor = gated
        await breakers.step(executor)

    redrive_every = settings.redrive_interval_seconds
    await asyncio.gather(
        periodic(stop, settings.recovery_interval_seconds, recover, name=RECOVERY_LOOP),
        periodic(stop, redrive_every, redrive, name=REDRIVE_LOOP, first_delay=redrive_every),
        # A resumed capability's waiting calls go at once, not a redrive threshold later;
        # while nothing was resumed, a step is one read of a table of a few rows.
        periodic(stop, settings.recovery_interval_seconds, resume, name=RESUME_LOOP),
        # While no breaker is open, a step is one read of a table of a few rows.
        periodic(stop, settings.recovery_interval_seconds, probe, name=BREAKER_LOOP),
    )
