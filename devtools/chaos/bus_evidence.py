"""What invariant 10 is checked against: the request records the broker kept (each
request topic read whole after the run) and the replies bus intake recorded (the
outbox rows of the replies topics), beside what the load sent; and whether bus intake
has caught up with its topics, for the run's settling.

The replies come from the database, not from the replies topics: the relay deletes
published rows only after a day (``TOOL_DISPATCHER_RELAY__RETENTION``, unset in a run),
and a broker restart forgets the topics' records, not the outbox's rows.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from devtools.chaos.checker import BusAnswer, Evidence
from devtools.chaos.stats import BusStats
from dispatcher.db.tables import bus_offsets, outbox
from dispatcher.settings import BusRoute
from kit.kafka import stop_consumer

READ_WITHIN = 60.0
"""Reading the request topics whole takes a second or two; a broker that does not give
their records up by then fails the run rather than judge it on half of them."""


async def _end_offsets(
    consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient, topics: Collection[str]
) -> dict[TopicPartition, int]:
    """Each partition of ``topics`` with its end offset (the broker's own partitions:
    a consumer's metadata may not hold a topic yet)."""
    tps = [
        TopicPartition(d["topic"], p["partition"])
        for d in await admin.describe_topics(sorted(topics))
        if d["error_code"] == 0
        for p in d["partitions"]
    ]
    return dict(await consumer.end_offsets(tps)) if tps else {}


@dataclass
class Kept:
    """The request records the broker kept."""

    by_event: Counter[str] = field(default_factory=Counter)
    """Records of each event id (``ce_id``)."""
    unreadable: int = 0
    """Records without a readable ``ce_id``."""
    clashing: int = 0
    """Records at an offset another record of their partition has too: not counted
    above. A log cannot hold two, but Tansu's can after a restart (its store keeps
    what was written to a partition of a topic auto-created too small, and the topic
    made again writes over it), and a consumer past that offset never reads the later
    one: a broker's defect, not bus intake's."""


def tally(records: Iterable[tuple[str, int, int, str | None]]) -> Kept:
    """``(topic, partition, offset, ce_id)`` of every record read, counted."""
    at: defaultdict[tuple[str, int, int], list[str | None]] = defaultdict(list)
    for topic, partition, offset, event_id in records:
        at[(topic, partition, offset)].append(event_id)
    kept = Kept()
    for event_ids in at.values():
        if len(event_ids) > 1:
            kept.clashing += len(event_ids)
            continue
        if event_ids[0] is None:
            kept.unreadable += 1
        else:
            kept.by_event[event_ids[0]] += 1
    return kept


async def kept_records(bootstrap: str, topics: Collection[str]) -> Kept:
    """Every record of ``topics`` from the beginning to the end offsets (all partitions,
    no group), counted by :func:`tally`."""
    read: list[tuple[str, int, int, str | None]] = []
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        await admin.start()
        ends = await _end_offsets(consumer, admin, topics)
        ends = {tp: end for tp, end in ends.items() if end > 0}
        if not ends:
            return Kept()
        consumer.assign(list(ends))
        await consumer.seek_to_beginning(*ends)
        left = set(ends)
        deadline = asyncio.get_running_loop().time() + READ_WITHIN
        while left:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"request topics not read to their ends: {sorted(left)}")
            batches = await consumer.getmany(*left, timeout_ms=1000)
            for tp, records in batches.items():
                for record in records:
                    if record.offset < ends[tp]:
                        read.append(
                            (tp.topic, tp.partition, record.offset, _event_id(record.headers))
                        )
            left = {tp for tp in left if await consumer.position(tp) < ends[tp]}
    finally:
        await stop_consumer(consumer)
        await admin.close()
    return tally(read)


def _event_id(headers: Collection[tuple[str, bytes]]) -> str | None:
    """The record's ``ce_id`` as bus intake reads it (names case-insensitive, one only)."""
    found = [value for name, value in headers if name.lower() == "ce_id"]
    if len(found) != 1:
        return None
    try:
        text = found[0].decode()
    except UnicodeDecodeError:
        return None
    return text or None


async def answers(engine: AsyncEngine, replies_topics: Collection[str]) -> list[BusAnswer]:
    payload = outbox.c.payload
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(
                outbox.c.headers["ce_requestid"].astext,
                payload["tenant"].astext,
                payload["outcome"].astext,
                payload["toolCallId"].astext,
                payload["problem"]["code"].astext,
            ).where(outbox.c.topic.in_(sorted(replies_topics)))
        )
        return [BusAnswer(*row) for row in rows]


async def caught_up(
    engine: AsyncEngine, bootstrap: str, routes: Mapping[str, BusRoute], group_id: str
) -> bool:
    """Whether bus intake has dealt with every record of its request topics: each
    partition recorded (``bus_offsets``) or committed by its group up to its end. The
    committed offset counts too: a defect that commits before it records must end the
    run as one that lost records, not as one that never settled."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        await admin.start()
        ends = await _end_offsets(consumer, admin, routes)
        # Named: Tansu drops the connection when asked for all of a group's offsets.
        committed = await admin.list_consumer_group_offsets(group_id, partitions=list(ends))
    finally:
        await stop_consumer(consumer)
        await admin.close()
    async with engine.connect() as conn:
        recorded = {
            TopicPartition(t, p): n
            for t, p, n in await conn.execute(
                select(bus_offsets.c.topic, bus_offsets.c.partition, bus_offsets.c.next_offset)
            )
        }
    for tp, end in ends.items():
        done = committed[tp].offset if tp in committed else -1
        if max(recorded.get(tp, 0), done) < end:
            return False
    return True


async def join(
    evidence: Evidence,
    engine: AsyncEngine,
    bootstrap: str,
    routes: Mapping[str, BusRoute],
    sent: BusStats,
) -> None:
    """Invariant 10's evidence, added to ``evidence``."""
    kept = await kept_records(bootstrap, routes)
    evidence.bus_kept = kept.by_event
    evidence.bus_unreadable = kept.unreadable
    evidence.bus_clashing = kept.clashing
    evidence.bus_answers = await answers(engine, {r.replies for r in routes.values()})
    evidence.bus_sent_acked = sent.sent_acked
    evidence.bus_sent_maybe = sent.sent_maybe
    evidence.bus_hostile = sent.hostile
