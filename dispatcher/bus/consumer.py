"""`tool-dispatcher bus-intake`: tool calls submitted as records on request topics.

Each fetch is read (:mod:`dispatcher.bus.records`), its unreadable records copied to
their dead-letter topics, and the rest recorded in one transaction
(:mod:`dispatcher.bus.recorder`); the group's offsets are committed after that commit.

Backpressure pauses partitions, it never drops or refuses a record:

- the database unreachable: every partition is paused and the same batch is recorded
  again once the database answers (``/readyz`` names ``database`` meanwhile);
- a tenant over its submission rate: its partitions are paused, from its first record
  without a token, until a token is there. Its lag grows, as its own producer's backlog
  would over HTTP, and no other tenant waits behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TypeAlias

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from dispatcher.buckets import TokenBuckets
from dispatcher.bus.continuity import fingerprint
from dispatcher.bus.recorder import Outcome, Recorded, Recorder
from dispatcher.bus.records import At, Read, Refused, read
from dispatcher.bus.spans import Membership, observe, observe_lag, record_spans
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.engine import create_engine
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.errors import RateLimited
from dispatcher.metrics import BUS_DEAD_LETTERS, BUS_PAUSED
from dispatcher.ops import Ops
from dispatcher.settings import BusRoute, Settings
from dispatcher.topics import ensure_topics_when_reachable
from kit.kafka import stop_consumer

log = logging.getLogger(__name__)

Record: TypeAlias = ConsumerRecord[bytes, bytes]
_BACKOFF_CAP_SECONDS = 5.0


async def run_bus_intake(
    settings: Settings, registry: CapabilityRegistry, stop: asyncio.Event, *, ops: Ops | None = None
) -> None:
    """Consume the configured request topics until ``stop`` is set; the batch in hand
    is recorded (or left unrecorded and uncommitted) first."""
    routes = settings.bus.routes()
    membership = Membership(settings.bus.group_id)
    if ops is not None:
        ops.add_check("consumer group", membership.check)
    if not await ensure_topics_when_reachable(settings, stop):
        return
    engine = create_engine(settings)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=settings.bus.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
        max_poll_records=settings.bus.batch_max,
        # A record at the size limit must still come in one fetch.
        max_partition_fetch_bytes=max(1_048_576, 2 * settings.bus.max_record_bytes),
        session_timeout_ms=settings.kafka_session_timeout_ms,
        heartbeat_interval_ms=max(300, settings.kafka_session_timeout_ms // 4),
        metadata_max_age_ms=settings.kafka_metadata_max_age_ms,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        acks="all",
        enable_idempotence=settings.kafka_enable_idempotence,
        max_request_size=max(1_048_576, 2 * settings.bus.max_record_bytes),
    )
    recorder = Recorder(engine, registry, settings.topics())
    intake = BusIntake(settings, routes, recorder, consumer, producer)
    membership.on_assigned = intake.assigned
    consumer.subscribe(sorted(routes), listener=membership)
    await producer.start()
    await consumer.start()
    log.info("bus intake consuming %s", ", ".join(sorted(routes)))
    try:
        while not stop.is_set():
            intake.resume_due()
            batches = await consumer.getmany(timeout_ms=200)
            observe_lag(consumer, batches)
            if batches:
                await intake.handle(batches, stop)
    finally:
        await stop_consumer(consumer)
        await producer.stop()
        await engine.dispose()


class BusIntake:
    """One process's handling of its fetched batches (state: the paused partitions)."""

    def __init__(
        self,
        settings: Settings,
        routes: dict[str, BusRoute],
        recorder: Recorder,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
    ) -> None:
        self._routes = routes
        self._recorder = recorder
        self._consumer = consumer
        self._producer = producer
        self._limit = settings.bus.max_record_bytes
        self._buckets = TokenBuckets(settings.submit_rate_per_second, settings.submit_burst)
        self._throttled: dict[TopicPartition, float] = {}
        self._expected: dict[TopicPartition, int] = {}
        """Each partition's next offset, where its fetch goes on from what this process
        handled (absent: to be judged at its next batch)."""

    def assigned(self, partitions: set[TopicPartition]) -> None:
        # A partition given back to this process after a rebalance starts unthrottled,
        # and from wherever the group had got to: its first batch is judged again.
        for tp in partitions:
            self._throttled.pop(tp, None)
            self._expected.pop(tp, None)

    async def handle(
        self, batches: dict[TopicPartition, list[Record]], stop: asyncio.Event
    ) -> None:
        # Partitions whose fetch does not continue what this process handled last: their
        # rows are checked to be of this log (dispatcher.bus.continuity).
        check = {
            (tp.topic, tp.partition): self._consumer.highwater(tp)
            for tp, records in batches.items()
            if records and self._expected.get(tp) != records[0].offset
        }
        reads = [
            read(self._routes[tp.topic], _at(r), r.key, r.value, r.headers, self._limit)
            for tp, records in sorted(batches.items())
            for r in records
        ]
        reads, held = self._throttle(reads)
        recorded = Recorded()
        if reads:
            poison = [r for r in reads if isinstance(r, Refused) and r.dead_letter]
            if poison:
                await self._dead_letter(poison, batches)
            with record_spans(reads) as traced:
                done = await self._record(traced, stop, check)
            if done is None:
                return  # stopping with the database away: nothing recorded, nothing committed
            recorded = done
        await self._follow(batches, recorded, held, check)
        observe(recorded.outcomes)
        await self._commit(recorded.outcomes)

    async def _follow(
        self,
        batches: dict[TopicPartition, list[Record]],
        recorded: Recorded,
        held: dict[TopicPartition, int],
        check: dict[tuple[str, int], int | None],
    ) -> None:
        """Where each fetched partition goes on from: after its last recorded record, at
        its held record, or sought elsewhere (to be judged again when read)."""
        last: dict[TopicPartition, int] = {}
        for o in recorded.outcomes:
            tp = TopicPartition(o.read.at.topic, o.read.at.partition)
            last[tp] = max(last.get(tp, -1), o.read.at.offset)
        for tp in batches:
            part = (tp.topic, tp.partition)
            self._expected.pop(tp, None)
            if part in recorded.seeks:
                await self._seek(tp, recorded.seeks[part])
            elif tp in held and (part not in check or tp in last):
                self._expected[tp] = held[tp]
            elif tp in last and tp not in held:
                self._expected[tp] = last[tp] + 1

    async def _seek(self, tp: TopicPartition, offset: int | None) -> None:
        try:
            if offset is None:
                await self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, offset)
        except IllegalStateError:
            pass  # given away meanwhile: its new owner judges it again

    def _throttle(self, reads: list[Read]) -> tuple[list[Read], dict[TopicPartition, int]]:
        """The reads within their tenants' rates. A partition whose record found no
        token is held from that record on: sought back to it and paused until a token
        is there (a refused read costs no token: it writes no call)."""
        kept: list[Read] = []
        held: dict[TopicPartition, int] = {}
        for r in reads:
            tp = TopicPartition(r.at.topic, r.at.partition)
            if tp in held:
                continue
            if not isinstance(r, Refused):
                try:
                    self._buckets.take(r.route.tenant)
                except RateLimited as exc:
                    held[tp] = r.at.offset
                    self._hold(tp, r.at.offset, exc.retry_after or 1)
                    continue
            kept.append(r)
        return kept, held

    def _hold(self, tp: TopicPartition, offset: int, seconds: float) -> None:
        try:
            self._consumer.seek(tp, offset)
            self._consumer.pause(tp)
        except IllegalStateError:
            return  # given away meanwhile: its new owner starts from the committed offset
        self._throttled[tp] = time.monotonic() + seconds
        BUS_PAUSED.labels("rate_limited").set(len(self._throttled))
        log.info("bus intake: %s is over its rate, paused %.0fs", tp.topic, seconds)

    def resume_due(self) -> None:
        if not self._throttled:
            return
        now = time.monotonic()
        due = [tp for tp, until in self._throttled.items() if until <= now]
        for tp in due:
            del self._throttled[tp]
            if tp in self._consumer.assignment():
                self._consumer.resume(tp)
        BUS_PAUSED.labels("rate_limited").set(len(self._throttled))

    async def _dead_letter(
        self, refused: Sequence[Refused], batches: dict[TopicPartition, list[Record]]
    ) -> None:
        """Copy each unreadable record, whole, to its route's dead-letter topic, with
        the reason in headers; every copy is acknowledged before the batch is recorded
        (a crash in between copies it again: at least once)."""
        originals = {
            (r.topic, r.partition, r.offset): r for records in batches.values() for r in records
        }
        sends = []
        for r in refused:
            original = originals[(r.at.topic, r.at.partition, r.at.offset)]
            headers = [
                *original.headers,
                ("dlq_code", r.error.code.encode()),
                ("dlq_reason", r.error.detail.encode()),
                ("dlq_topic", r.at.topic.encode()),
                ("dlq_partition", str(r.at.partition).encode()),
                ("dlq_offset", str(r.at.offset).encode()),
            ]
            sends.append(
                await self._producer.send(
                    r.route.dead_letters, original.value, key=original.key, headers=headers
                )
            )
            BUS_DEAD_LETTERS.labels(r.at.topic, r.error.code).inc()
        await asyncio.gather(*sends)

    async def _record(
        self, reads: list[Read], stop: asyncio.Event, check: dict[tuple[str, int], int | None]
    ) -> Recorded | None:
        """Record ``reads``; while the database is unreachable, every partition waits
        paused and the same batch is tried again (the batch in memory: a rebalance
        meanwhile is safe, the recorded offsets decide who records what)."""
        delay, paused = 0.25, False
        try:
            while True:
                try:
                    return await self._recorder.record(reads, check)
                except Exception as exc:  # every database failure waits; a bug is logged
                    kind = classify(exc)
                    if kind is not DbErrorClass.UNAVAILABLE:
                        log.exception("bus intake: recording a batch failed (%s)", kind)
                    else:
                        log.warning("bus intake: database unreachable; partitions paused")
                if not paused:
                    paused = True
                    self._consumer.pause(*self._consumer.assignment())
                    BUS_PAUSED.labels("database").set(len(self._consumer.assignment()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    return None
                delay = min(2 * delay, _BACKOFF_CAP_SECONDS)
        finally:
            if paused:
                held = set(self._throttled)
                self._consumer.resume(*(tp for tp in self._consumer.assignment() if tp not in held))
                BUS_PAUSED.labels("database").set(0)

    async def _commit(self, outcomes: Sequence[Outcome]) -> None:
        offsets: dict[TopicPartition, int] = {}
        for o in outcomes:
            tp = TopicPartition(o.read.at.topic, o.read.at.partition)
            offsets[tp] = max(offsets.get(tp, 0), o.read.at.offset + 1)
        held = self._consumer.assignment()
        mine = {tp: offset for tp, offset in offsets.items() if tp in held}
        if not mine:
            return
        try:
            await self._consumer.commit(mine)
        except (CommitFailedError, IllegalStateError, KafkaError) as exc:
            # The batch is recorded: a redelivery of it is skipped by its offsets.
            log.warning("bus intake: offset commit failed (%s); recorded all the same", exc)


def _at(record: Record) -> At:
    return At(
        record.topic,
        record.partition,
        record.offset,
        record.timestamp,
        fingerprint(record.timestamp, record.key, record.value),
    )
