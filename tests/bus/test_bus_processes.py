"""`tool-dispatcher bus-intake` as real processes on the real broker and database: a
consumer group losing a member to SIGKILL and gaining one mid-stream, the database cut
under it, and a whole topic delivered again to a new group. Whatever happens, every
record is recorded once: one call or one refusal, one reply, in partition order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psutil  # type: ignore[import-untyped]
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import RecordMetadata

from devtools.chaos.proxy import ProxyMode, TcpProxy
from devtools.embedded import free_port
from devtools.registries import NOWHERE
from dispatcher.bus.records import derived_key
from tests.fixtures.bus import body, headers, producing, rows, wait_recorded
from tests.fixtures.stack import MakeStack, ProcessStack, exited
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow, pytest.mark.process]

HOST = "127.0.0.1"
TENANTS = ("acme", "globex")
PARTITIONS = 4
SOURCE = "/tests/bus-processes"
# Small batches: many transactions, so a kill or a cut finds one in flight.
BATCH_MAX = 50


@dataclass(frozen=True)
class Planned:
    """One request record to produce, and what it must become."""

    tenant: str
    event_id: str
    key: bytes
    value: bytes
    refusal: str | None
    """The problem code of its refusal; None: it must become a call."""


def plan(per_tenant: int, *, keys: int = 24, prefix: str = "") -> list[Planned]:
    """``per_tenant`` records for each tenant, interleaved, on ``keys`` keys per tenant
    (a key's records land on one partition, in order); a few are refused: one naming
    the other tenant, one naming a capability nobody registered."""
    planned = []
    for i in range(per_tenant):
        for tenant in TENANTS:
            key = f"{tenant}-{prefix}k{i % keys}"
            fields: dict[str, Any] = {"capabilityId": "refund", "input": {"orderId": f"o-{i}"}}
            refusal = None
            if i % 97 == 40:
                fields["tenant"] = next(t for t in TENANTS if t != tenant)
                refusal = "tenant_mismatch"
            elif i % 97 == 80:
                fields["capabilityId"] = "no-such-capability"
                refusal = "capability_not_found"
            planned.append(
                Planned(tenant, f"{tenant}-{prefix}{i}", key.encode(), body(key, **fields), refusal)
            )
    return planned


@dataclass(frozen=True)
class Intake:
    process: subprocess.Popen[bytes]
    port: int


class BusProcesses:
    """One test's request topics and its bus-intake processes (all killed at its end)."""

    def __init__(self, stack: ProcessStack, database_url: str, bootstrap: str) -> None:
        self.stack = stack
        self.database_url = database_url
        self.bootstrap = bootstrap
        self.run = uuid.uuid4().hex[:8]
        self.group = f"td-{self.run}-bus"

    def topic(self, tenant: str) -> str:
        return f"td-{self.run}.requests.{tenant}"

    def replies(self, tenant: str) -> str:
        return f"td-{self.run}.replies.{tenant}"

    async def create_topics(self) -> None:
        """The request topics, made before any process or producer touches them."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(self.topic(t), PARTITIONS, 1) for t in TENANTS])
        finally:
            await admin.close()

    def start(
        self, name: str, *, group: str | None = None, database_url: str | None = None
    ) -> Intake:
        port = free_port(HOST)
        env = {
            "ops_port": str(port),
            "bus__topics": json.dumps({self.topic(t): t for t in TENANTS}),
            "bus__group_id": group or self.group,
            "bus__batch_max": str(BATCH_MAX),
        }
        if database_url is not None:
            env["database_url"] = database_url
        return Intake(self.stack.start("bus-intake", name=name, **env), port)

    async def produce(
        self, producer: AIOKafkaProducer, planned: Sequence[Planned]
    ) -> dict[str, RecordMetadata]:
        futures = [
            await producer.send(
                self.topic(p.tenant), p.value, key=p.key, headers=headers(p.event_id, source=SOURCE)
            )
            for p in planned
        ]
        sent = await asyncio.gather(*futures)
        return {p.event_id: meta for p, meta in zip(planned, sent, strict=True)}

    async def recorded(self) -> int:
        """Records recorded so far (the topics are new: every partition starts at 0)."""
        found = await rows(
            self.database_url, "SELECT coalesce(sum(next_offset), 0) FROM bus_offsets"
        )
        return int(found[0][0])


async def answer(intake: Intake, path: str) -> httpx.Response | None:
    try:
        async with httpx.AsyncClient(timeout=3.0) as client:
            return await client.get(f"http://{HOST}:{intake.port}{path}")
    except httpx.TransportError:
        return None


async def readyz(stack: ProcessStack, intake: Intake, status: int) -> httpx.Response:
    """Wait until the process's /readyz answers ``status``; it must stay up meanwhile."""
    last: list[httpx.Response | None] = [None]

    async def answered() -> bool:
        assert intake.process.poll() is None, stack.log_of(intake.process)
        last[0] = await answer(intake, "/readyz")
        return last[0] is not None and last[0].status_code == status

    await eventually(answered, what=f"/readyz on :{intake.port} to answer {status}")
    assert last[0] is not None
    return last[0]


async def records_of(intake: Intake) -> float:
    """The records this process itself recorded (accepted or refused), by its metrics."""
    metrics = await answer(intake, "/metrics")
    if metrics is None or metrics.status_code != 200:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.text.splitlines()
        if line.startswith("tool_dispatcher_bus_records_total{")
    )


@contextlib.asynccontextmanager
async def outbox_locked(database_url: str) -> AsyncIterator[None]:
    """For the block, every batch being recorded waits at its first outbox row: its
    transaction open, its offsets and calls written but not committed."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn, conn.transaction():
        await conn.execute("LOCK TABLE outbox IN SHARE MODE")
        yield


async def waiting_mid_batch(database_url: str, intake: Intake) -> bool:
    """Whether the process's transaction has written and now waits for a lock, by its
    connections' client ports in ``pg_stat_activity``."""
    server = urlsplit(database_url).port or 5432
    ports = [
        c.laddr.port
        for c in psutil.Process(intake.process.pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == server
    ]
    found = await rows(
        database_url,
        "SELECT count(*) FROM pg_stat_activity WHERE client_port = ANY(%s)"
        " AND backend_xid IS NOT NULL AND wait_event_type = 'Lock'",
        ports,
    )
    return bool(found[0][0])


async def check_recorded_once(
    bus: BusProcesses, planned: Sequence[Planned], sent: dict[str, RecordMetadata]
) -> None:
    """Every planned record is exactly one call or exactly one refusal, answered by
    exactly one reply on its tenant's replies topic, and each partition's calls were
    requested in the order of their records' offsets."""
    accepted = [p for p in planned if p.refusal is None]
    assert len(accepted) < len(planned)  # refusals are part of the test
    # One call per accepted record (keyed by its event: ce_source and ce_id), per tenant;
    # none for a refused one, none twice.
    calls = await rows(
        bus.database_url, "SELECT tenant, idempotency_key, tool_call_id FROM tool_calls"
    )
    keys = Counter((tenant, key) for tenant, key, _ in calls)
    wanted = Counter((p.tenant, derived_key(SOURCE, p.event_id)) for p in accepted)
    lost, extra = wanted - keys, keys - wanted
    assert not lost and not extra, f"{lost.total()} records lost, {extra.total()} calls too many"

    # One reply per record, on its own tenant's replies topic, saying what became of it.
    found = await rows(
        bus.database_url,
        "SELECT topic, headers->>'ce_requestid', payload FROM outbox WHERE topic = ANY(%s)",
        [bus.replies(t) for t in TENANTS],
    )
    counts = Counter(request_id for _, request_id, _ in found)
    twice = {request_id: n for request_id, n in counts.items() if n != 1}
    assert not twice, f"{len(twice)} records answered more than once: {sorted(twice)[:10]}"
    assert set(counts) == {p.event_id for p in planned}
    by_id = {request_id: (topic, payload) for topic, request_id, payload in found}
    for p in planned:
        topic, payload = by_id[p.event_id]
        assert topic == bus.replies(p.tenant), p
        assert payload["tenant"] == p.tenant, p
        if p.refusal is None:
            assert payload["outcome"] == "accepted", (p, payload)
        else:
            assert payload["outcome"] == "refused", (p, payload)
            assert payload["problem"]["code"] == p.refusal, (p, payload)
    # The accepted replies name the calls, each a different one.
    answered = [by_id[p.event_id][1]["toolCallId"] for p in accepted]
    assert sorted(answered) == sorted(call for _, _, call in calls)

    # Each call requested once, from its own record; per partition in offset order.
    events = await rows(
        bus.database_url,
        "SELECT payload->'via'->'bus' FROM execution_events"
        " WHERE event_type = 'tool.call.requested' ORDER BY seq",
    )
    origins = [(v["topic"], v["partition"], v["offset"]) for (v,) in events]
    assert sorted(origins) == sorted(
        (sent[p.event_id].topic, sent[p.event_id].partition, sent[p.event_id].offset)
        for p in accepted
    )
    by_partition: dict[tuple[str, int], list[int]] = defaultdict(list)
    for topic, partition, offset in origins:
        by_partition[(topic, partition)].append(offset)
    for tp, offsets in by_partition.items():
        assert offsets == sorted(offsets), f"{tp} recorded out of order"


async def test_a_group_losing_a_member_to_sigkill_and_gaining_one_records_each_record_once(
    make_stack: MakeStack, database_url: str, kafka_bootstrap: str
) -> None:
    stack = make_stack(sandbox_url=NOWHERE, topic_partitions=PARTITIONS)
    bus = BusProcesses(stack, database_url, kafka_bootstrap)
    await bus.create_topics()
    planned = plan(1000)
    assert len(planned) == 2000
    group = [bus.start(f"intake-{i}") for i in range(3)]
    for intake in group:
        await readyz(stack, intake, 200)
    doomed, survivors = group[0], group[1:]

    async with producing(kafka_bootstrap) as producer:
        # Every member caught mid-batch: the doomed one is killed with its transaction
        # open and half written, the others' batches are held through the rebalances
        # (the newcomer's, the doomed one's departure) and committed after them.
        async with outbox_locked(database_url):
            sent = await bus.produce(producer, planned[:1500])

            async def doomed_mid_batch() -> bool:
                return await waiting_mid_batch(database_url, doomed)

            await eventually(doomed_mid_batch, what="the doomed process to be mid-batch")
            os.killpg(doomed.process.pid, signal.SIGKILL)
            assert await exited(doomed.process) == -signal.SIGKILL
            late = bus.start("late")
            await readyz(stack, late, 200)  # it joined the group: the rest is shared with it
        sent |= await bus.produce(producer, planned[1500:])
        await wait_recorded(database_url, list(sent.values()), within=180)

    for intake in [*survivors, late]:
        assert intake.process.poll() is None, stack.log_of(intake.process)
    assert await records_of(late) > 0  # the newcomer took its share
    await check_recorded_once(bus, planned, sent)


CUT_SECONDS = 20.0
"""How long the database stays cut (the outage's length, not a bound on anything)."""


async def test_a_database_cut_mid_stream_pauses_intake_and_loses_nothing(
    make_stack: MakeStack, database_url: str, kafka_bootstrap: str
) -> None:
    url = urlsplit(database_url)
    proxy = TcpProxy(url.hostname or HOST, url.port or 5432)
    await proxy.start()
    try:
        netloc = f"{url.username}@{HOST}:{proxy.port}" if url.username else f"{HOST}:{proxy.port}"
        proxied = urlunsplit(url._replace(netloc=netloc))
        stack = make_stack(sandbox_url=NOWHERE, topic_partitions=PARTITIONS)
        bus = BusProcesses(stack, database_url, kafka_bootstrap)
        await bus.create_topics()
        planned = plan(300)
        intake = bus.start("intake", database_url=proxied)
        await readyz(stack, intake, 200)

        async with producing(kafka_bootstrap) as producer:
            sent = await bus.produce(producer, planned[:400])

            async def started() -> bool:
                return await bus.recorded() > 0

            await eventually(started, what="the first batch to be recorded")
            proxy.set_mode(ProxyMode.CUT)
            cut = await readyz(stack, intake, 503)
            assert cut.json()["failed"] == ["database"], cut.json()
            frozen = await bus.recorded()
            # More records arrive while the database is away.
            sent |= await bus.produce(producer, planned[400:])
            await asyncio.sleep(CUT_SECONDS)
            still = await readyz(stack, intake, 503)
            assert still.json()["failed"] == ["database"], still.json()
            assert await bus.recorded() == frozen  # nothing recorded without the database

            proxy.set_mode(ProxyMode.PASS)
            await readyz(stack, intake, 200)
            await wait_recorded(database_url, list(sent.values()), within=120)
        assert intake.process.poll() is None, stack.log_of(intake.process)
        await check_recorded_once(bus, planned, sent)
    finally:
        await proxy.stop()


async def committed(
    bootstrap: str, group: str, partitions: Sequence[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """``group``'s committed offsets (-1: none), asked by a consumer that joins nothing."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        found = {tp: await consumer.committed(TopicPartition(*tp)) for tp in partitions}
    finally:
        await consumer.stop()
    return {tp: -1 if offset is None else offset for tp, offset in found.items()}


async def everything_written(database_url: str) -> dict[str, list[tuple[Any, ...]]]:
    """The rows recording the requests write (their times and ids included)."""
    return {
        "calls": await rows(database_url, "SELECT * FROM tool_calls ORDER BY tool_call_id"),
        "events": await rows(database_url, "SELECT * FROM execution_events ORDER BY seq"),
        "outbox": await rows(database_url, "SELECT * FROM outbox ORDER BY id"),
        "offsets": await rows(
            database_url, "SELECT topic, partition, next_offset FROM bus_offsets ORDER BY 1, 2"
        ),
    }


async def test_records_delivered_again_to_a_new_group_write_nothing_new(
    make_stack: MakeStack, database_url: str, kafka_bootstrap: str
) -> None:
    stack = make_stack(sandbox_url=NOWHERE, topic_partitions=PARTITIONS)
    bus = BusProcesses(stack, database_url, kafka_bootstrap)
    await bus.create_topics()
    planned = plan(150)
    first = bus.start("first", group=f"{bus.group}-first")
    async with producing(kafka_bootstrap) as producer:
        sent = await bus.produce(producer, planned)
        await wait_recorded(database_url, list(sent.values()))
        await check_recorded_once(bus, planned, sent)
        before = await everything_written(database_url)
        first.process.terminate()
        assert await exited(first.process) == 0, stack.log_of(first.process)

        # A group that never committed anything: the broker delivers every record again.
        again = f"{bus.group}-again"
        second = bus.start("second", group=again)
        ends: dict[tuple[str, int], int] = {}
        for meta in sent.values():
            tp = (meta.topic, meta.partition)
            ends[tp] = max(ends.get(tp, 0), meta.offset + 1)

        async def read_through() -> bool:
            assert second.process.poll() is None, stack.log_of(second.process)
            done = await committed(kafka_bootstrap, again, list(ends))
            return all(done[tp] >= end for tp, end in ends.items())

        await eventually(read_through, what="the new group to commit past every record")
        after = await everything_written(database_url)
        for table, found in after.items():
            was = before[table]
            assert found == was, (
                f"{table}: {len(was)} rows before the redelivery, {len(found)} after"
            )

        # And it goes on with records it has not seen, each once.
        fresh = plan(10, prefix="fresh-")
        sent |= await bus.produce(producer, fresh)
        await wait_recorded(database_url, list(sent.values()))
    await check_recorded_once(bus, [*planned, *fresh], sent)
