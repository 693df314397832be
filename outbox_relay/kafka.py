"""The Kafka side: rows become CloudEvents (binary mode), failures are sorted into
"retry later" and "this row can never be delivered".

A failure is permanent only when the broker or client says so about *this message*
(too large, invalid or unauthorised topic, or a topic the broker reports as unknown
while answering); anything else -- connection refused, timeouts, leader changes --
is transient and only retried, because dead-lettering during a broker outage would
turn an outage into data an operator has to replay by hand.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    PolicyViolationError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
    UnsupportedForMessageFormatError,
)

from outbox_relay.config import RelayConfig

CONTENT_TYPE = b"application/json"

# Kafka error codes a metadata answer gives for a topic that will not start working
# by itself: unknown (auto-create off), invalid name, not authorised.
_PERMANENT_TOPIC_CODES = {3: "unknown topic", 17: "invalid topic name", 29: "topic not authorised"}

PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    InvalidTopicError,
    TopicAuthorizationFailedError,
    CorruptRecordException,
    UnsupportedForMessageFormatError,
    InvalidTimestampError,
    PolicyViolationError,
)


class OutboxRow(NamedTuple):
    """One unpublished row as the relay reads it (``payload`` is the JSON text).

    A tuple rather than a dataclass: the relay builds thousands per batch."""

    id: int
    topic: str
    key: str
    payload: str
    headers: Mapping[str, Any]
    created_at: datetime


class PermanentTopicError(KafkaError):  # type: ignore[misc]
    """The broker answered that a topic cannot be written to."""

    retriable = False


def is_permanent(exc: BaseException) -> bool:
    """True when retrying ``exc`` cannot succeed, so the row goes to dead letters."""
    return isinstance(exc, (*PERMANENT_ERRORS, PermanentTopicError))


def describe_error(exc: BaseException) -> str:
    """A one-line description for ``last_error`` and the logs."""
    name, text = type(exc).__name__, str(exc).strip()
    return text if name in text else f"{name}: {text}" if text else name


def kafka_headers(headers: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    """The row's headers as Kafka headers: CloudEvents binary mode carries the event's
    attributes (``ce_id``, ``ce_type``, ...) and any ``traceparent`` there; the
    content type says the value is JSON."""
    out: list[tuple[str, bytes]] = [("content-type", CONTENT_TYPE)]
    for name, value in headers.items():
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        out.append((name, text.encode()))
    return out


def build_producer(config: RelayConfig) -> AIOKafkaProducer:
    """A producer that only reports a message sent once every in-sync replica has it."""
    return AIOKafkaProducer(
        bootstrap_servers=config.kafka_bootstrap,
        client_id=f"outbox-relay-{config.relay_id}",
        acks="all",
        enable_idempotence=config.enable_idempotence,
        request_timeout_ms=config.request_timeout_ms,
        max_request_size=config.max_message_bytes,
        linger_ms=config.linger_ms,
        metadata_max_age_ms=config.metadata_max_age_ms,
        max_batch_size=256 * 1024,
    )


class TopicGate:
    """Checks, once per topic, that the broker will take messages for it.

    ``producer.send`` waits ``request_timeout_ms`` for the metadata of a topic that
    does not exist, and then cannot say whether the broker was down or the topic is
    bad. Asking the broker first keeps a poison topic from stalling every batch, and
    tells the two cases apart.
    """

    def __init__(self, producer: AIOKafkaProducer, config: RelayConfig) -> None:
        self._producer = producer
        self._config = config
        self._admin: AIOKafkaAdminClient | None = None
        self._known: set[str] = set()

    async def close(self) -> None:
        """Close the admin connection if one was opened."""
        if self._admin is not None:
            admin, self._admin = self._admin, None
            await admin.close()

    def forget(self) -> None:
        """Ask about every topic again: after the broker was unreachable it may have
        been replaced or lost topics, and some brokers (Tansu) acknowledge writes to a
        topic they have not yet re-created, then drop them."""
        self._known.clear()

    async def check(self, topics: Iterable[str]) -> dict[str, PermanentTopicError]:
        """The topics among ``topics`` that can never be written to.

        Raises a (transient) :class:`KafkaError` when the broker cannot be asked.
        """
        unknown = [t for t in set(topics) if t not in self._known]
        if not unknown:
            return {}
        bad: dict[str, PermanentTopicError] = {}
        for entry in await self._describe(unknown):
            topic, code = entry["topic"], entry["error_code"]
            if code in _PERMANENT_TOPIC_CODES:
                bad[topic] = PermanentTopicError(f"{_PERMANENT_TOPIC_CODES[code]}: {topic!r}")
            elif code != 0:
                raise KafkaError(f"metadata of topic {topic!r} not available (error {code})")
        good = [t for t in unknown if t not in bad]
        timeout = self._config.request_timeout_ms / 1000
        for topic in good:
            try:
                await asyncio.wait_for(self._producer.partitions_for(topic), timeout)
            except TimeoutError as exc:
                raise KafkaTimeoutError(f"no partitions of topic {topic!r} yet") from exc
            self._known.add(topic)
        return bad

    async def _describe(self, topics: list[str]) -> list[dict[str, Any]]:
        if self._admin is None:
            admin = AIOKafkaAdminClient(
                bootstrap_servers=self._config.kafka_bootstrap,
                client_id=f"outbox-relay-{self._config.relay_id}-admin",
                request_timeout_ms=self._config.request_timeout_ms,
            )
            try:
                await admin.start()
            except BaseException:
                await admin.close()
                raise
            self._admin = admin
        answer: list[dict[str, Any]] = await self._admin.describe_topics(topics)
        return answer
