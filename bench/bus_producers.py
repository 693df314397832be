"""The bus side of ``bench.bus_intake``: ``tool-dispatcher bus-intake`` in a process of
its own, producers of request records in the bench's process, and when each record was
seen recorded (``bus_offsets``, written in the transaction that records the calls)."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from aiokafka import AIOKafkaProducer

from bench.harness import service_env, stop_process
from bench.intake_rows import CAPABILITY, INPUT, TENANT
from devtools.embedded import free_port
from devtools.registries import SANDBOX_REGISTRY

POLL_SECONDS = 0.005
PARTITIONS = 8


def request_record(event_id: str, run: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A request record's value and headers: what HTTP intake is sent, as a CloudEvent."""
    value = json.dumps({"runId": run, "capabilityId": CAPABILITY, "input": INPUT}).encode()
    headers = {
        "ce_specversion": "1.0",
        "ce_id": event_id,
        "ce_source": "/bench/bus-intake",
        "ce_type": "tool.call.submit",
        "content-type": "application/json",
    }
    return value, [(k, v.encode()) for k, v in headers.items()]


# --- the bus intake process ---------------------------------------------------------


@contextlib.asynccontextmanager
async def bus_process(url: str, bootstrap: str, topic: str, log: Path) -> AsyncIterator[int]:
    """``python -m tool_dispatcher bus-intake`` consuming ``topic`` for the bench's
    tenant, no rate limit (one tenant at full speed is what is measured); yields its
    pid once it is ready (joined its group)."""
    ops = free_port()
    env = {
        **service_env(url, bootstrap, SANDBOX_REGISTRY),
        "TOOL_DISPATCHER_BUS__TOPICS": json.dumps({topic: TENANT}),
        "TOOL_DISPATCHER_BUS__GROUP_ID": f"{topic}-intake",
        "TOOL_DISPATCHER_SUBMIT_RATE_PER_SECOND": "0",
        "TOOL_DISPATCHER_TOPIC_PARTITIONS": str(PARTITIONS),
        "TOOL_DISPATCHER_OPS_PORT": str(ops),
    }
    out = await asyncio.to_thread(log.open, "wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tool_dispatcher", "bus-intake", env=env, stdout=out, stderr=out
    )
    try:
        await _ready(ops, proc)
        yield proc.pid
    finally:
        await stop_process(proc)
        out.close()


async def _ready(port: int, proc: asyncio.subprocess.Process, within: float = 60) -> None:
    async with httpx.AsyncClient() as client, asyncio.timeout(within):
        while proc.returncode is None:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"bus intake exited ({proc.returncode}) before it was ready")


# --- what was recorded, and when -------------------------------------------------


@dataclass
class Commits:
    """``bus_offsets`` of one topic as polled: when each partition's recorded offset
    moved, by this process's clock (``time.time()``)."""

    url: str
    topic: str
    seen: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)

    async def poll(self, stop: asyncio.Event) -> None:
        sql = "SELECT partition, next_offset FROM bus_offsets WHERE topic = %s"
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            while not stop.is_set():
                rows = await (await conn.execute(sql, (self.topic,))).fetchall()
                now = time.time()
                for partition, offset in rows:
                    offsets, times = self.seen.setdefault(partition, ([], []))
                    if not offsets or offset > offsets[-1]:
                        offsets.append(offset)
                        times.append(now)
                await asyncio.sleep(POLL_SECONDS)

    def recorded_at(self, partition: int, offset: int) -> float | None:
        """When ``offset`` of ``partition`` was first seen recorded, if it was."""
        offsets, times = self.seen.get(partition, ([], []))
        i = bisect.bisect_right(offsets, offset)
        return times[i] if i < len(times) else None

    async def wait(self, sent: list[Sent], within: float = 300) -> float:
        """Until every sent record is seen recorded; when the last one was."""
        async with asyncio.timeout(within):
            while True:
                at = [self.recorded_at(s.partition, s.offset) for s in sent]
                if all(t is not None for t in at):
                    return max(t for t in at if t is not None)
                await asyncio.sleep(POLL_SECONDS)


@dataclass(frozen=True, slots=True)
class Sent:
    partition: int
    offset: int
    at: float  # time.time() at send, whose milliseconds are the record's timestamp


async def produce(
    producer: AIOKafkaProducer,
    topic: str,
    run: str,
    ids: list[str],
    sent: list[Sent],
    pace: tuple[float, float] = (0.0, 0.0),
) -> None:
    """One producer: each record sent once the broker acknowledged the one before, and
    with ``pace`` (start, interval) not before its turn (start + n * interval)."""
    start, interval = pace
    for n, event_id in enumerate(ids):
        if interval and (wait := start + n * interval - time.time()) > 0:
            await asyncio.sleep(wait)
        value, headers = request_record(event_id, run)
        at = time.time()
        ack = await producer.send(
            topic, value, key=run.encode(), headers=headers, timestamp_ms=int(at * 1000)
        )
        meta = await ack
        sent.append(Sent(meta.partition, meta.offset, at))


async def produce_all(
    producer: AIOKafkaProducer, topic: str, producers: int, calls: int, tag: str, rate: float = 0
) -> list[Sent]:
    """``calls`` records from ``producers`` producers, each its own run's (its key); as
    fast as the broker acknowledges them, or ``rate`` a second in all, the producers'
    turns staggered."""
    sent: list[Sent] = []
    shares = [calls // producers + (i < calls % producers) for i in range(producers)]
    ids = [[f"{tag}-{i}-{n}" for n in range(share)] for i, share in enumerate(shares)]
    interval, start = (producers / rate if rate else 0.0), time.time()
    await asyncio.gather(
        *(
            produce(producer, topic, f"run-{i}", ids[i], sent, (start + i / rate, interval))
            if rate
            else produce(producer, topic, f"run-{i}", ids[i], sent)
            for i in range(producers)
        )
    )
    return sent
