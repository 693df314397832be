"""The relay: read unpublished rows, publish them, mark them -- in that order.

Mechanism
---------
* **Lanes.** Every row has a ``lane`` (a hash of its key, computed by the database at
  insert), so all rows of one key share a lane. Each lane is leased to one relay
  instance at a time (``<table>_lanes``: owner, expires_at, heartbeat_at); live
  instances share the lanes out evenly and renew their leases every ``lease_ttl/3``.
* **Batches.** A relay reads up to ``batch_size`` unpublished rows of the lanes it holds
  an unexpired lease on, in id order (the lease test is part of the read). It sends them
  all, waits for every acknowledgement (acks=all), and then marks, in one transaction,
  each row whose own send *and* every earlier send of its key succeeded. Nothing is
  marked before the broker acknowledged it: at least once, never lost. Each message
  carries the row's fixed ``ce_id``, so consumers drop the duplicates a crash causes.
* **No gaps.** There is no high-water mark: every read asks for all unpublished rows
  (see :mod:`outbox_relay.queries` on commit-order gaps), so a transaction that took a
  lower id but committed late is published by the next read.
* **Handover.** Lanes change hands only between batches (rebalancing) or after a lease
  lapsed (a dead relay). The new owner re-reads every unmarked row, so it re-sends the
  dead relay's in-flight batch (duplicates) in the same order, then continues.
* **Wake-up.** An idle relay LISTENs, and while one does a statement trigger NOTIFYs
  on insert; it also polls every ``poll_interval``. A relay whose last read found rows
  reads again ``read_interval`` after it, without listening, and writers do not notify
  it (:mod:`outbox_relay.wakeup`): a stream of small commits is published in batches,
  not one notification and batch each.

Order guarantee (per key, counting each message's first delivery)
-----------------------------------------------------------------
If row *a* of key K committed before row *b* of K was inserted (the usual case: the
writer of *b* saw *a*'s effects), *a* reaches the topic before *b*. Proof sketch: *a*
then has the lower id and is visible to every read that sees *b*; a read returns a
key's rows in id order; a later row of K is never sent in a batch where an earlier
one failed, never marked while an earlier one is unmarked, and a dead-lettered row
stops its key. Rows of K written by *concurrent* transactions reach the topic in the
order the relay saw them commit (id order among rows that became visible together).
Re-sends after a crash or lease handover repeat a prefix in the same order, which
changes no message's first delivery. One caveat without the idempotent producer: a
broker that fails one produce request after its timeout and then accepts the next
for the same partition can let a later row overtake an earlier one; the relay then
holds the later row back, re-sends both in order and counts it in
``outbox_relay_possibly_reordered_total``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

import psycopg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from opentelemetry.trace import Span
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from kit import telemetry
from kit.periodic import periodic
from kit.signals import sleep_unless
from outbox_relay import metrics
from outbox_relay.backoff import Backoff
from outbox_relay.config import RelayConfig
from outbox_relay.kafka import OutboxRow, TopicGate, build_producer, is_permanent, kafka_headers
from outbox_relay.leases import LaneLeases
from outbox_relay.marks import record
from outbox_relay.queries import Queries, relay_session
from outbox_relay.retention import purge_batches
from outbox_relay.schedule import heartbeat_waits, purge_due
from outbox_relay.settle import NOT_SENT, Outcome, settle
from outbox_relay.spans import end_publish_spans, publish_span
from outbox_relay.table import notify_channel
from outbox_relay.wakeup import Presence, listen, wait_first

log = logging.getLogger(__name__)

Connection = psycopg.AsyncConnection[TupleRow]


class TransientPublishError(Exception):
    """Some rows could not be published for now; they stay unmarked and are retried."""

    def __init__(self, message: str, *, published: int = 0) -> None:
        super().__init__(message)
        self.published = published
        """Rows of the same batch that were published and marked anyway."""


# What the relay survives by backing off and trying again: the broker or the
# database being away. Anything else is a bug and stops the process.
TRANSIENT = (TransientPublishError, KafkaError, psycopg.OperationalError, PoolTimeout)

HOUSEKEEPING_LOOP = "outbox_housekeeping"
"""The ``loop`` label of the gauge and retention loop's step metrics."""


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What one :meth:`Relay.run_once` did."""

    read: int = 0
    published: int = 0
    dead_lettered: int = 0
    failed: int = 0


class Relay:
    """One relay instance. Use as an async context manager, then :meth:`run` or
    :meth:`run_once`."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.queries = Queries.for_table(config.table)
        self.leases = LaneLeases(self.queries, config.relay_id, config.lease_ttl)
        self._pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            config.conninfo,
            min_size=2,
            max_size=4,
            kwargs={"autocommit": True},
            configure=relay_session,
            open=False,
            timeout=max(5.0, config.lease_ttl),
            name=f"outbox-relay-{config.table}",
        )
        self._producer: AIOKafkaProducer = build_producer(config)
        self._gate = TopicGate(self._producer, config)
        self._lease_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        # Set while the relay is idle: only then does it LISTEN (outbox_relay.wakeup).
        self._listen = asyncio.Event()
        self._listen.set()
        self._blocked_seen: dict[int, int] = {}
        self._labels = {"table": config.table}

    async def __aenter__(self) -> Self:
        await self._pool.open(wait=False)
        try:
            await self._producer.start()
        except BaseException:
            await self._producer.stop()
            await self._pool.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            async with self._lease_lock, self._pool.connection() as conn:
                await self.leases.release_all(conn)
        except (psycopg.Error, PoolTimeout) as exc:
            log.warning(
                "could not hand back lanes (they lapse in %ss): %s", self.config.lease_ttl, exc
            )
        await self._gate.close()
        await self._producer.stop()
        await self._pool.close()

    async def heartbeat(self) -> frozenset[int]:
        """Renew leases and take a fair share of lanes; returns the lanes held."""
        async with self._lease_lock, self._pool.connection() as conn:
            before = self.leases.owned
            owned = await self.leases.heartbeat(conn)
        metrics.OWNED_LANES.labels(**self._labels).set(len(owned))
        if owned - before:
            self._wake.set()
        return owned

    async def run_once(self) -> BatchResult:
        """Read, publish and mark one batch of the lanes this relay holds.

        Raises :class:`TransientPublishError` (after marking what did get through)
        when some rows must wait for the broker to recover.
        """
        async with self._pool.connection() as conn:
            if self.leases.excess:
                async with self._lease_lock:
                    await self.leases.release_excess(conn)
            cur = await conn.execute(
                self.queries.claim, {"owner": self.config.relay_id, "limit": self.config.batch_size}
            )
            rows = list(map(OutboxRow._make, await cur.fetchall()))
            metrics.BATCH_SIZE.labels(**self._labels).observe(len(rows))
            if not rows:
                return BatchResult()
            try:
                outcomes = await self._publish(rows)
            except KafkaError:
                self._gate.forget()
                raise
            result = settle(rows, outcomes)
            await record(conn, self.queries, result)
        metrics.count_settlement(result, self._labels)
        if result.transient:
            self._gate.forget()
            row, error = result.failed[0]
            raise TransientPublishError(
                f"{len(result.failed)} row(s) not acknowledged, first id {row.id}: {error}",
                published=len(result.published),
            )
        return BatchResult(len(rows), len(result.published), len(result.dead), 0)

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set; the batch in flight is finished first."""
        helpers = [
            asyncio.create_task(self._heartbeats(stop), name="outbox-relay-heartbeat"),
            asyncio.create_task(
                listen(
                    self.config.conninfo,
                    notify_channel(self.config.table),
                    self._wake,
                    self._listen,
                    stop,
                    Presence(self.queries, self.config.relay_id, self.config.lease_ttl),
                ),
                name="outbox-relay-listen",
            ),
            asyncio.create_task(self._housekeeping(stop), name="outbox-relay-housekeeping"),
        ]
        try:
            await self._loop(stop)
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)

    async def _loop(self, stop: asyncio.Event) -> None:
        backoff = Backoff(self.config.backoff_initial, self.config.backoff_max)
        loop = asyncio.get_running_loop()
        last_read = -math.inf
        while not stop.is_set():
            # Paced: the commits of the rest of the interval join this read's batch.
            pause = last_read + self.config.read_interval - loop.time()
            if pause > 0 and await sleep_unless(stop, pause):
                return
            last_read = loop.time()
            # Cleared before the read: a row committed during the batch sets it again.
            self._wake.clear()
            try:
                result = await self.run_once()
            except TRANSIENT as exc:
                if stop.is_set():
                    return
                # Progress means the broker takes writes again: try again soon rather
                # than keep the wait an outage built up (see outbox_relay.backoff).
                progress = isinstance(exc, TransientPublishError) and exc.published > 0
                # A little jitter, so relays that lost the broker together do not all
                # come back in the same millisecond (not a secret: S311 does not apply).
                delay = backoff.after(progress=progress) + random.uniform(  # noqa: S311
                    0, self.config.backoff_initial
                )
                log.warning(
                    "relay batch failed (attempt %d since progress), retrying in %.2fs: %s",
                    backoff.failures,
                    delay,
                    exc,
                )
                await sleep_unless(stop, delay)
                continue
            backoff.reset()
            if result.read:
                # A stream of commits, or a backlog: the next read, an interval after
                # this one began, finds the rows committed meanwhile, with no
                # notification for each.
                self._listen.clear()
                continue
            # Idle: listen again. The listener wakes the relay once it does, and the read
            # that follows finds what committed before LISTEN took effect.
            self._listen.set()
            await wait_first(stop.wait(), self._wake.wait(), seconds=self.config.poll_interval)

    async def _publish(self, rows: list[OutboxRow]) -> list[Outcome]:
        topics = {t: self.config.kafka_topic(t) for t in {r.topic for r in rows}}
        bad_topics = await self._gate.check(topics.values())
        outcomes: list[Outcome] = [NOT_SENT] * len(rows)
        pending: list[tuple[int, asyncio.Future[Any]]] = []
        # A key whose earlier row failed sends nothing more in this batch.
        broken: set[str] = set()
        # Checked once a batch: without an exporter no span is made at all.
        spans: dict[int, Span] | None = {} if telemetry.enabled() else None
        for i, row in enumerate(rows):
            if row.key in broken:
                continue
            topic = topics[row.topic]
            if bad_topics and topic in bad_topics:
                outcomes[i] = bad_topics[topic]
                broken.add(row.key)
                continue
            if spans is not None:
                spans[i] = publish_span(row, topic)
            try:
                future = await self._producer.send(
                    topic,
                    row.payload.encode(),
                    key=row.key.encode(),
                    headers=kafka_headers(row.headers),
                )
            except KafkaError as exc:
                outcomes[i] = exc
                broken.add(row.key)
                if not is_permanent(exc):
                    # The client itself is stuck (buffer full, no metadata): every
                    # further send would wait out the same timeout.
                    break
                continue
            pending.append((i, future))
        acks = await asyncio.gather(*(f for _, f in pending), return_exceptions=True)
        for (i, _), ack in zip(pending, acks, strict=True):
            outcomes[i] = ack if isinstance(ack, BaseException) else None
        if spans:
            end_publish_spans(spans, outcomes)
        return outcomes

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        every, retry = heartbeat_waits(self.config.lease_ttl)
        while not stop.is_set():
            try:
                await self.heartbeat()
            except (psycopg.Error, PoolTimeout) as exc:
                log.warning("lease heartbeat failed: %s", exc)
                if await sleep_unless(stop, retry):
                    return
                continue
            if await sleep_unless(stop, every):
                return

    async def _housekeeping(self, stop: asyncio.Event) -> None:
        """Gauges at once and every ``metrics_interval``, retention when it is due. A
        failed round waits the same interval (``backoff_max``): the gauges are what
        shows an outage, so they are not refreshed less often during one."""
        loop = asyncio.get_running_loop()
        next_purge, retention_interval = loop.time(), self.config.retention_interval

        async def step() -> None:
            nonlocal next_purge
            await self.refresh_gauges()
            purge, next_purge = purge_due(loop.time(), next_purge, retention_interval)
            if purge:
                async with self._pool.connection() as conn:
                    deleted = await purge_batches(
                        conn,
                        self.queries,
                        older_than=self.config.retention,
                        batch_size=self.config.retention_batch,
                    )
                if deleted:
                    log.info("retention deleted %d published row(s)", deleted)

        every = self.config.metrics_interval
        await periodic(stop, every, step, name=HOUSEKEEPING_LOOP, backoff_max=every)

    async def refresh_gauges(self) -> None:
        """Update backlog, oldest-age, dead-letter and blocked-row gauges; log dead
        letters that hold rows of their key back."""
        async with self._pool.connection() as conn:
            row = await (await conn.execute(self.queries.backlog)).fetchone()
            blocked = await (await conn.execute(self.queries.blocked)).fetchall()
        backlog, oldest, dead = row if row else (0, None, 0)
        labels = self._labels
        metrics.BACKLOG.labels(**labels).set(backlog)
        age = (datetime.now(UTC) - oldest).total_seconds() if oldest else 0.0
        metrics.OLDEST_AGE.labels(**labels).set(max(age, 0.0))
        metrics.DEAD_LETTERS.labels(**labels).set(dead)
        metrics.BLOCKED.labels(**labels).set(sum(n for _, _, n in blocked))
        seen = {dead_id: n for dead_id, _, n in blocked}
        for dead_id, key, n in blocked:
            if self._blocked_seen.get(dead_id) != n:
                log.warning("%d row(s) of key %r blocked behind dead letter id %d", n, key, dead_id)
        self._blocked_seen = seen


async def run_relay(config: RelayConfig, stop: asyncio.Event) -> None:
    """Run one relay instance until ``stop`` is set (e.g. by a SIGTERM handler).

    The batch in flight when ``stop`` is set is published and marked before this
    returns; leases are handed back so other instances take over at once.
    """
    async with Relay(config) as relay:
        await relay.run(stop)


async def run_once(config: RelayConfig) -> BatchResult:
    """Take a fair share of lanes, relay one batch, hand the lanes back (for tests
    and one-shot jobs)."""
    async with Relay(config) as relay:
        await relay.heartbeat()
        return await relay.run_once()
