"""Submitting tool calls over the bus: :class:`BusSubmitter` writes a request record (a
CloudEvent in Kafka's binary binding) on a tenant's request topic, and can wait for its
reply::

    async with BusSubmitter("kafka:9092", "tool-calls.requests.acme", source="/billing") as bus:
        event_id = await bus.submit(
            SubmitRequest(run_id="run-1", capability_id="send-email", input={"to": "a@x.io"})
        )
        reply = await bus.reply(event_id, within=30)
        print(reply.outcome, reply.tool_call_id or reply.problem)

Imported on its own (``dispatcher.client`` does not load it): it needs aiokafka, and
no server code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from cloudevents.core.bindings.kafka import to_binary
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from dispatcher.schemas import SubmitRequest
from kit.kafka import stop_consumer

log = logging.getLogger(__name__)

SUBMIT = "tool.call.submit"
_KEPT_REPLIES = 10_000


@dataclass(frozen=True, slots=True)
class BusReply:
    """A reply record: ``accepted`` (with the call as ``POST /v1/tool-calls`` answers
    it) or ``refused`` (with the problem+json and its ``code``)."""

    request_id: str
    outcome: str
    tool_call_id: str | None
    status: str | None
    call: dict[str, Any] | None
    problem: dict[str, Any] | None
    created: bool | None = None
    """For ``accepted``: whether this request made the call (False: it replayed one, as
    HTTP's 200 says)."""

    @classmethod
    def of(cls, data: dict[str, Any]) -> BusReply:
        return cls(
            data["requestId"], data["outcome"], data.get("toolCallId"), data.get("status"),
            data.get("call"), data.get("problem"), data.get("created"),
        )  # fmt: skip


def replies_topic(request_topic: str) -> str:
    """The topic bus intake answers ``request_topic``'s records on (the service's rule:
    ``.requests.`` becomes ``.replies.``, else ``.replies`` is appended)."""
    if ".requests." in request_topic:
        return request_topic.replace(".requests.", ".replies.", 1)
    return f"{request_topic}.replies"


class BusSubmitter:
    """Writes request records on ``topic``; with ``replies=True`` (the default) it also
    reads that topic's replies from the moment it starts, for :meth:`reply`."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        source: str,
        replies: bool = True,
        **kafka: Any,
    ) -> None:
        """``kafka``: further aiokafka options for both clients, such as
        ``security_protocol="SASL_SSL"``, ``ssl_context``, ``sasl_mechanism`` and
        ``sasl_plain_username`` (a broker with ACLs authenticates its producers)."""
        self.topic = topic
        self.source = source
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all", **kafka)
        self._consumer = (
            # A replies log made again (a topic recreated) is read from its start: the
            # replies it holds now are all newer than this submitter.
            AIOKafkaConsumer(
                bootstrap_servers=bootstrap_servers,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                **kafka,
            )
            if replies
            else None
        )
        self._seen: OrderedDict[str, BusReply] = OrderedDict()
        self._waiting: dict[str, asyncio.Future[BusReply]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> BusSubmitter:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect, and find the replies topic; a start that fails (no broker, no
        replies topic) closes what it opened before it raises, so a caller that gives
        up or tries again with a new submitter leaves no client behind."""
        try:
            await self._producer.start()
            if self._consumer is not None:
                await self._follow_replies(self._consumer)
        except BaseException:
            # What went wrong first is what the caller hears of, not a close after it.
            with contextlib.suppress(Exception):
                await self.stop()
            raise

    async def _follow_replies(self, consumer: AIOKafkaConsumer) -> None:
        await consumer.start()
        topic = replies_topic(self.topic)
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            # Assigned nothing, it would wait for every reply in vain.
            raise LookupError(f"no topic {topic!r}: bus intake creates it when it starts")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:  # fix the positions now: a reply written later is read
            await consumer.position(tp)
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        """Close both clients, whatever became of the reader of replies (the producer
        even when the consumer's close fails)."""
        try:
            if self._reader is not None:
                self._reader.cancel()
                # Waited for, not awaited: a reader that had failed must not keep the
                # clients below from closing.
                await asyncio.wait([self._reader])
                if not self._reader.cancelled() and self._reader.exception() is not None:
                    log.warning("the reader of replies had stopped: %r", self._reader.exception())
        finally:
            try:
                if self._consumer is not None:
                    await stop_consumer(self._consumer)
            finally:
                await self._producer.stop()

    async def submit(
        self,
        request: SubmitRequest,
        *,
        event_id: str | None = None,
        key: str | None = None,
        traceparent: str | None = None,
    ) -> str:
        """Write ``request`` and wait for the broker's acknowledgement; its event id.

        Sending the same ``event_id`` again (a retry after a timeout) records one call:
        without a key of its own or its capability's template, the request is keyed by
        its event. ``key`` orders records (by default the run: a run's calls are
        recorded in order)."""
        attributes: dict[str, Any] = {
            "id": event_id or str(uuid.uuid4()),
            "source": self.source,
            "type": SUBMIT,
            "specversion": "1.0",
            "datacontenttype": "application/json",
        }
        if traceparent:
            attributes["traceparent"] = traceparent
        data = request.model_dump(by_alias=True, exclude_none=True, mode="json")
        message = to_binary(CloudEvent(attributes=attributes, data=data), JSONFormat())
        await self._producer.send_and_wait(
            self.topic,
            message.value,
            key=(key or request.run_id).encode(),
            headers=[(k, v) for k, v in message.headers.items()],
        )
        return str(attributes["id"])

    async def reply(self, event_id: str, *, within: float) -> BusReply:
        """The reply to the request ``event_id``; ``TimeoutError`` after ``within`` s."""
        if self._consumer is None:
            raise RuntimeError("this submitter reads no replies (replies=False)")
        if event_id in self._seen:
            return self._seen[event_id]
        future = self._waiting.setdefault(event_id, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(asyncio.shield(future), within)
        finally:
            if future.done():
                self._waiting.pop(event_id, None)

    async def _read(self) -> None:
        assert self._consumer is not None  # noqa: S101 - started with one
        async for record in self._consumer:
            answer = _reply_of(record.value)
            if answer is None:
                continue
            self._seen[answer.request_id] = answer
            while len(self._seen) > _KEPT_REPLIES:
                self._seen.popitem(last=False)
            waiting = self._waiting.get(answer.request_id)
            if waiting is not None and not waiting.done():
                waiting.set_result(answer)


def _reply_of(value: bytes | None) -> BusReply | None:
    """The reply a record holds; None for an empty record or one that holds no reply,
    which is logged and skipped: one bad record on the replies topic must not stop the
    replies after it from reaching their submitters."""
    if value is None:
        return None
    try:
        return BusReply.of(orjson.loads(value))
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        log.warning("skipped a record on the replies topic that holds no reply: %r", exc)
        return None
