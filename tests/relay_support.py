"""Helpers for the relay tests: writing outbox rows, reading topics back, and running
``python -m outbox_relay`` as a real process."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer
from psycopg.types.json import Jsonb

from outbox_relay import OutboxMessage, RelayConfig

REPO = Path(__file__).resolve().parent.parent


def relay_config(database_url: str, bootstrap: str, **overrides: Any) -> RelayConfig:
    """Settings for a relay in a test: Tansu has no idempotent producer, leases are short."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "kafka_bootstrap": bootstrap,
        "enable_idempotence": False,
        "lease_ttl": 2.0,
        "poll_interval": 0.2,
        "backoff_initial": 0.05,
        "backoff_max": 0.5,
        "metrics_interval": 0.5,
        "request_timeout_ms": 5000,
    }
    values.update(overrides)
    return RelayConfig(**values)


def message(topic: str, key: str, seq: int, **headers: str) -> dict[str, Any]:
    """Row values of one test message; the payload names its key and sequence."""
    return OutboxMessage(
        topic=topic,
        key=key,
        type="test.event",
        source="/tests/relay",
        payload={"key": key, "seq": seq},
        headers=dict(headers),
    ).row()


INSERT = "INSERT INTO outbox (topic, key, payload, headers) VALUES (%s, %s, %s, %s)"


def row_params(rows: Iterable[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["topic"], r["key"], Jsonb(r["payload"]), Jsonb(r["headers"])) for r in rows]


async def insert(database_url: str, rows: Sequence[dict[str, Any]]) -> None:
    """Insert ``rows`` in one transaction."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.cursor() as cur:
            await cur.executemany(INSERT, row_params(rows))
        await conn.commit()


async def fill(database_url: str, topic: str, count: int, keys: int) -> None:
    """``count`` rows over ``keys`` keys, committed in chunks; key k's seq rises by id."""
    chunk = 5000
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        for start in range(0, count, chunk):
            rows = [
                message(topic, f"k{i % keys}", i) for i in range(start, min(count, start + chunk))
            ]
            async with conn.cursor() as cur:
                await cur.executemany(INSERT, row_params(rows))
            await conn.commit()


async def scalar(database_url: str, query: str, *params: Any) -> Any:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        row = await (await conn.execute(query, params or None)).fetchone()  # type: ignore[arg-type]
        return row[0] if row else None


async def unpublished(database_url: str) -> int:
    return int(await scalar(database_url, "SELECT count(*) FROM outbox WHERE published_at IS NULL"))


@dataclass(frozen=True)
class Received:
    """One consumed message."""

    key: str
    value: dict[str, Any]
    headers: dict[str, str]
    partition: int
    offset: int

    @property
    def ce_id(self) -> str:
        return self.headers["ce_id"]

    @property
    def seq(self) -> int:
        return int(self.value["seq"])


class TopicReader:
    """Reads a topic from the beginning; call :meth:`until` to wait for messages."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.messages: list[Received] = []
        self._consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            # Tansu holds every fetch for the full wait.
            fetch_max_wait_ms=10,
            max_partition_fetch_bytes=4 * 1024 * 1024,
        )

    async def __aenter__(self) -> TopicReader:
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def poll(self, wait: float = 0.1) -> list[Received]:
        got: list[Received] = []
        batches = await self._consumer.getmany(timeout_ms=int(wait * 1000), max_records=10_000)
        for records in batches.values():
            for r in records:
                got.append(
                    Received(
                        key=r.key.decode(),
                        value=json.loads(r.value),
                        headers={k: v.decode() for k, v in r.headers},
                        partition=r.partition,
                        offset=r.offset,
                    )
                )
        self.messages.extend(got)
        return got

    async def until(self, predicate: Any, within: float) -> list[Received]:
        """Read until ``predicate(messages)`` holds; fails the test after ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not predicate(self.messages):
            if loop.time() > deadline:
                raise AssertionError(
                    f"timed out after {within}s with {len(self.messages)} message(s)"
                )
            await self.poll()
        return self.messages

    async def distinct(self, count: int, within: float) -> list[Received]:
        """Read until ``count`` distinct message ids arrived."""
        return await self.until(lambda ms: len({m.ce_id for m in ms}) >= count, within)


def first_deliveries(messages: Iterable[Received]) -> list[Received]:
    """Each message id once, at its first position (what a deduplicating consumer sees)."""
    seen: set[str] = set()
    out = []
    for m in messages:
        if m.ce_id not in seen:
            seen.add(m.ce_id)
            out.append(m)
    return out


def assert_key_order(messages: Iterable[Received]) -> None:
    """Within every partition, each key's first deliveries have rising ``seq``."""
    last: dict[str, int] = {}
    for m in sorted(first_deliveries(messages), key=lambda m: (m.partition, m.offset)):
        previous = last.get(m.key, -1)
        assert m.seq > previous, f"key {m.key}: seq {m.seq} after {previous}"
        last[m.key] = m.seq


class RelayProcess:
    """``python -m outbox_relay`` as a child process."""

    def __init__(self, database_url: str, bootstrap: str, *extra: str, log: Path) -> None:
        self.args = [
            sys.executable,
            "-m",
            "outbox_relay",
            "--database-url",
            database_url,
            "--bootstrap",
            bootstrap,
            "--no-idempotence",
            "--lease-ttl",
            "2",
            "--poll-interval",
            "0.2",
            "--request-timeout-ms",
            "5000",
            "--backoff-max",
            "0.5",
            *extra,
        ]
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RelayProcess:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def stop_quietly(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class RunningRelay:
    """``run_relay`` as a background task of the test's event loop."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RunningRelay:
        from outbox_relay import run_relay

        self.task = asyncio.create_task(run_relay(self.config, self.stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 30)


async def eventually(check: Any, within: float, every: float = 0.01) -> None:
    """Await ``check()`` until it returns true; fail the test after ``within`` seconds."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110 - polls the database, not an event
            await asyncio.sleep(every)
