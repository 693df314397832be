"""bench.bus_intake's producers send what HTTP intake is sent, as request records bus
intake reads as submissions; every record is a distinct event (a repeated ``ce_id``
lands once and would flatter calls/s); and a record counts as recorded from the first
poll that saw its partition's ``bus_offsets`` past it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, cast

from aiokafka import AIOKafkaProducer

from bench.bus_producers import Commits, produce_all, request_record
from bench.intake_rows import CAPABILITY, INPUT, TENANT
from dispatcher.bus.records import At, Request, read
from dispatcher.settings import BusRoute


def test_a_record_is_the_http_body_read_as_a_submission_of_the_topics_tenant() -> None:
    value, headers = request_record("e-1", "run-3")
    assert json.loads(value) == {"runId": "run-3", "capabilityId": CAPABILITY, "input": INPUT}
    route = BusRoute(f"td-bench.requests.{TENANT}", TENANT)
    found = read(route, At(route.topic, 0, 0), b"run-3", value, headers, 256 * 1024)
    assert isinstance(found, Request)
    assert (found.event_id, found.route.tenant) == ("e-1", TENANT)
    assert found.submission.capability_id == CAPABILITY
    assert found.submission.input == INPUT


@dataclass
class _Meta:
    partition: int
    offset: int


class _Broker:
    """Acknowledges every send at once, one partition per key."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, dict[str, bytes]]] = []

    async def send(self, topic: str, value: bytes, **kw: Any) -> asyncio.Future[_Meta]:
        self.records.append((kw["key"], dict(kw["headers"])))
        ack: asyncio.Future[_Meta] = asyncio.get_running_loop().create_future()
        ack.set_result(_Meta(int(kw["key"].split(b"-")[1]), len(self.records)))
        return ack


async def test_every_record_is_a_distinct_event_keyed_by_its_producers_run() -> None:
    broker = _Broker()
    sent = await produce_all(cast(AIOKafkaProducer, broker), "t", 4, 10, "m")
    assert len(sent) == len(broker.records) == 10
    ids = [h["ce_id"] for _, h in broker.records]
    assert len(set(ids)) == 10
    by_run = {key: sum(1 for k, _ in broker.records if k == key) for key, _ in broker.records}
    assert by_run == {b"run-0": 3, b"run-1": 3, b"run-2": 2, b"run-3": 2}
    assert all(h["ce_id"].decode().split("-")[1] == k.decode()[4:] for k, h in broker.records)


def test_a_record_is_recorded_from_the_poll_that_saw_its_offset_passed() -> None:
    commits = Commits("unused", "t", {0: ([5, 9], [100.0, 101.0])})
    assert commits.recorded_at(0, 4) == 100.0
    assert commits.recorded_at(0, 5) == 101.0  # next_offset 5: offset 5 not yet recorded
    assert commits.recorded_at(0, 9) is None
    assert commits.recorded_at(1, 0) is None
