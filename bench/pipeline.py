"""The whole pipeline at a fixed offered rate: a producer process calling ``submit()``
open loop (``bench.pipeline_producer``), the relay process publishing its outbox rows,
and a consumer here reading the dispatch commands, in one run, beside a minimal writer
(raw psycopg inserting the same three outbox rows a submission publishes) with the same
relay and consumer.

Printed per writer: the offered and achieved rates (committed calls over the time from
the first call's scheduled start to the last commit), p50 and p99 from a call's
scheduled start to its dispatch command's arrival at the consumer (an open loop: a
producer that falls behind shows it as latency), the p99 to its commit alone (the
producer's and PostgreSQL's share of it), and CPU per call of the producer, the
relay and PostgreSQL. Each writer runs on a fresh database and a fresh broker (Tansu
slows as its partitions grow). Run it as::

    .venv/bin/python -m bench.pipeline [--rate 1000] [--seconds 10] [--rounds 1]
        [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from bench.cpu import Rescanned, Sampler, by_role, cpu_between, role_of, with_children
from bench.harness import postgres_processes, render_table
from bench.intake import ScratchDatabases
from bench.relay import relay_process
from bench.relay_latency import create_topics
from devtools.embedded import Tansu
from dispatcher.settings import DEFAULT_TOPICS

WRITERS = ("minimal", "submit", "submit-psycopg")
"""The minimal writer, then ``submit()`` in an ``AsyncSession`` and on a psycopg
connection (bench.pipeline_producer)."""
TARGET_RATE = 0.95
TARGET_P99 = 2.0


@dataclass
class Round:
    writer: str
    offered: float
    achieved: float = 0.0
    latencies: list[float] = field(default_factory=list)
    commits: list[float] = field(default_factory=list)
    """Each call's scheduled start to its commit: the producer's share of its latency."""
    cpu_us: dict[str, float] = field(default_factory=dict)
    lost: int = 0
    busy: float = 0.0
    """Cores the rest of the machine kept busy meanwhile (this process, the consumer,
    is part of it)."""

    def pct(self, q: float, of: list[float] | None = None) -> float:
        values = sorted(self.latencies if of is None else of)
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


class Arrivals:
    """When each dispatch command was read (wall clock), by its toolCallId, from the
    start: a call's arrival is stamped as it is read, not once the producer is done."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.wanted: set[str] | None = None
        self.complete = asyncio.Event()

    async def follow(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=100)
            now = time.time()
            for records in batches.values():
                for r in records:
                    call = orjson.loads(r.value).get("toolCallId") if r.value else None
                    if isinstance(call, str):
                        self.at.setdefault(call, now)
            self._check()

    def expect(self, wanted: set[str]) -> None:
        self.wanted = wanted
        self._check()

    def _check(self) -> None:
        if self.wanted is not None and self.wanted <= self.at.keys():
            self.complete.set()


async def one_round(url: str, writer: str, args: argparse.Namespace, home: Path) -> Round:
    found = Round(writer, args.rate)
    broker = Tansu(log_file=home / f"tansu-{writer}.log")
    bootstrap = await asyncio.to_thread(broker.start)
    topic = DEFAULT_TOPICS.dispatch
    relay = relay_process(url, bootstrap, 1000, 0, args.read_interval)
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
        fetch_max_wait_ms=10,
    )  # fmt: skip
    try:
        await create_topics(bootstrap, [topic, DEFAULT_TOPICS.events])
        await consumer.start()
        arrivals = Arrivals()
        reader = asyncio.create_task(arrivals.follow(consumer))
        await asyncio.sleep(2.0)  # the relay up, its lanes taken
        out = home / f"calls-{writer}.json"
        producer = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.pipeline_producer", "--database-url", url,
            "--mode", writer, "--rate", str(args.rate), "--seconds", str(args.seconds),
            "--out", str(out), *(["--frozen-heap"] if args.frozen_heap else []),
        )  # fmt: skip
        pids = {relay.pid: "relay", producer.pid: "producer", broker.pid: "broker"}
        named = {pid: role for pid, role in pids.items() if pid is not None}
        database = url.rsplit("/", 1)[-1]
        # Sampled while the producer runs: its connections' backends exit with it, and
        # a process counts up to its last sample (bench.cpu).
        sampler = Sampler(
            Rescanned(lambda: [*with_children(named), *postgres_processes(database)], 0.2),
            role=lambda p: role_of(p, named),
        ).start()
        started = time.time()
        code = await producer.wait()
        if code != 0:
            raise RuntimeError(f"the {writer} producer exited {code}")
        produced: dict[str, Any] = json.loads(out.read_text())
        calls = {c[0]: (c[1], c[2]) for c in produced["calls"]}
        arrivals.expect(set(calls))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(arrivals.complete.wait(), timeout=60)
        reader.cancel()
        arrived = arrivals.at
        samples = sampler.stop()
        used = by_role(samples, sampler.roles, started, samples[-1].at)
        found.busy = cpu_between(samples, started, samples[-1].at)[1] / (samples[-1].at - started)
    finally:
        await consumer.stop()
        relay.terminate()
        relay.wait(timeout=30)
        await asyncio.to_thread(broker.stop)
    first = min(s for s, _ in calls.values())
    last = max(c for _, c in calls.values())
    found.achieved = len(calls) / max(args.seconds, last - first)
    found.latencies = [arrived[c] - calls[c][0] for c in calls if c in arrived]
    found.commits = [committed - scheduled for scheduled, committed in calls.values()]
    found.lost = len(calls) - len(found.latencies)
    n = len(calls) or 1
    found.cpu_us = {
        "producer": 1e6 * produced["cpuSeconds"] / n,
        "relay": 1e6 * used.get("relay", 0.0) / n,
        "broker": 1e6 * used.get("broker", 0.0) / n,
        "postgres": 1e6 * (used.get("pg backends", 0.0) + used.get("pg shared", 0.0)) / n,
    }
    return found


def report(rounds: list[Round], markdown: bool) -> str:
    rows = [
        [
            r.writer, f"{r.offered:.0f}", f"{r.achieved:.0f}", f"{r.achieved / r.offered:.2f}",
            f"{r.pct(0.5) * 1000:.1f}", f"{r.pct(0.99) * 1000:.1f}",
            f"{r.pct(0.99, r.commits) * 1000:.1f}", str(r.lost),
            f"{r.cpu_us['producer']:.0f}", f"{r.cpu_us['relay']:.0f}",
            f"{r.cpu_us['broker']:.0f}", f"{r.cpu_us['postgres']:.0f}", f"{r.busy:.2f}",
        ]
        for r in rounds
    ]  # fmt: skip
    header = ["writer", "offered/s", "achieved/s", "ratio", "p50 ms", "p99 ms",
              "p99 to commit ms", "lost",
              "producer µs/call", "relay µs/call", "broker µs/call", "postgres µs/call",
              "rest of machine, cores"]  # fmt: skip
    return render_table(rows, header, markdown=markdown)


def verdicts(rounds: list[Round]) -> list[str]:
    """The targets, on the median of each writer's rounds."""
    share = {w: _median([r.achieved / r.offered for r in rounds if r.writer == w]) for w in WRITERS}
    p99 = {w: _median([r.pct(0.99) for r in rounds if r.writer == w]) for w in WRITERS}
    lines = []
    for w in WRITERS[1:]:
        ratio = p99[w] / p99["minimal"]
        lines += [
            f"{w}: achieved {share[w]:.2f} of the offered rate (minimal writer"
            f" {share['minimal']:.2f}), target >= {TARGET_RATE}:"
            f" {'met' if share[w] >= TARGET_RATE else 'MISS'}",
            f"{w} / minimal p99: {ratio:.2f}x, target <= {TARGET_P99}:"
            f" {'met' if ratio <= TARGET_P99 else 'MISS'}",
        ]
    return lines


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def main_async(args: argparse.Namespace) -> int:
    dbs = ScratchDatabases(args.database_url)
    dbs.create_template()
    rounds: list[Round] = []
    heaps = ", every writer's heap frozen (kit.heap)" if args.frozen_heap else ""
    print(f"pipeline: {args.rate:g} calls/s offered for {args.seconds:g} s, open loop{heaps}")
    try:
        with tempfile.TemporaryDirectory(prefix="td-pipeline-") as tmp:
            for n in range(args.rounds):
                for writer in WRITERS if n % 2 == 0 else WRITERS[::-1]:
                    with dbs.cell() as url:
                        found = await one_round(url, writer, args, Path(tmp))
                    rounds.append(found)
                    print(f"  {writer}: achieved {found.achieved:.0f}/s,"
                          f" p99 {found.pct(0.99) * 1000:.1f} ms", flush=True)  # fmt: skip
    finally:
        dbs.drop()
    print()
    print(report(rounds, markdown=False))
    print("\n" + "\n".join(verdicts(rounds)) + "\n")
    print(report(rounds, markdown=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--read-interval", type=float, default=None,
        help="the relay's --read-interval (default: the relay's own)",
    )  # fmt: skip
    parser.add_argument(
        "--frozen-heap", action="store_true",
        help="every writer prepares its heap as the service's processes do (kit.heap)",
    )  # fmt: skip
    parser.add_argument(
        "--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a server where this user may CREATE DATABASE; scratch databases are dropped",
    )  # fmt: skip
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
