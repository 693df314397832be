"""What bus intake tells about itself: its group membership (``/readyz``), its metrics,
and its spans, each continuing its producer's ``traceparent``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from opentelemetry import trace

from dispatcher.bus.recorder import Outcome
from dispatcher.bus.records import Read, Request
from dispatcher.errors import DispatcherError
from dispatcher.metrics import (
    BUS_BATCH_RECORDS,
    BUS_LAG,
    BUS_PRODUCE_TO_COMMIT_SECONDS,
    BUS_RECORDS,
)
from dispatcher.ops import NotReady
from kit import telemetry

tracer = trace.get_tracer("tool_dispatcher")


class Membership(ConsumerRebalanceListener):  # type: ignore[misc]
    """Whether this process is a member of its group right now (ready), and who to tell
    when partitions are assigned."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.joined = False
        self.on_assigned: Callable[[set[TopicPartition]], None] | None = None

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.joined = False

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.joined = True
        if self.on_assigned is not None:
            self.on_assigned(assigned)

    async def check(self) -> None:
        if not self.joined:
            raise NotReady(f"not joined to consumer group {self.group}")


_LAGGING: set[tuple[str, int]] = set()


def observe_lag(
    consumer: AIOKafkaConsumer, batches: dict[TopicPartition, list[ConsumerRecord[Any, Any]]]
) -> None:
    """Each fetched partition's lag: its high watermark minus the offset after its last
    fetched record. A partition given away drops its series."""
    held = {(tp.topic, tp.partition) for tp in consumer.assignment()}
    for gone in _LAGGING - held:
        BUS_LAG.remove(gone[0], str(gone[1]))
        _LAGGING.discard(gone)
    for tp, records in batches.items():
        highwater = consumer.highwater(tp) if (tp.topic, tp.partition) in held else None
        if highwater is not None and records:
            BUS_LAG.labels(tp.topic, str(tp.partition)).set(
                max(0, highwater - records[-1].offset - 1)
            )
            _LAGGING.add((tp.topic, tp.partition))


def observe(outcomes: Sequence[Outcome]) -> None:
    """Count a recorded batch's records by outcome, and their time from produce."""
    now_ms = time.time() * 1000
    recorded = 0
    for o in outcomes:
        if o.result is None:
            continue  # recorded by an earlier batch, counted then
        recorded += 1
        if isinstance(o.result, DispatcherError):
            BUS_RECORDS.labels(o.read.at.topic, "refused", o.result.code).inc()
        else:
            BUS_RECORDS.labels(o.read.at.topic, "accepted", "").inc()
        if o.read.at.timestamp_ms is not None:
            BUS_PRODUCE_TO_COMMIT_SECONDS.observe(max(0.0, now_ms - o.read.at.timestamp_ms) / 1000)
    BUS_BATCH_RECORDS.observe(recorded)


@contextmanager
def record_spans(reads: Sequence[Read]) -> Iterator[list[Read]]:
    """With traces on, one ``tool_dispatcher.bus_intake`` span per request, child of its
    producer's ``traceparent``, open until the batch is recorded; the requests come
    back carrying their span's context, which their calls store. Off, the reads as
    they are: each call stores its producer's own context."""
    if not telemetry.enabled():
        yield list(reads)
        return
    spans: list[trace.Span] = []
    traced: list[Read] = []
    for r in reads:
        if not isinstance(r, Request):
            traced.append(r)
            continue
        span = tracer.start_span(
            "tool_dispatcher.bus_intake",
            context=telemetry.context_of(r.traceparent, r.tracestate),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "kafka",
                "messaging.destination.name": r.at.topic,
                "messaging.destination.partition.id": str(r.at.partition),
                "messaging.kafka.offset": r.at.offset,
                "messaging.message.id": r.event_id,
            },
        )
        spans.append(span)
        context = telemetry.traceparent_of(span.get_span_context())
        traced.append(dataclasses.replace(r, traceparent=context, tracestate=None))
    try:
        yield traced
    finally:
        for span in spans:
            span.end()
