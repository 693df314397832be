"""Settling ``result_unknown`` calls: tool-dispatcher's reconciler beside a minimal
ideal reconciler (bench.ideal_reconciler), in one run against one sandbox, one broker
and one scratch database, with the sandbox's own lookup rate. Target: the
reconciler at >= 0.9x the ideal's calls/s, over a small backlog (3,000 due calls) as
over a large one (10,000); a pair of rounds for each size in ``--calls``.

    .venv/bin/python -m bench.reconcile [--database-url URL] [--calls 3000,10000]
        [--rounds 3] [--batch-size 500] [--concurrency 64] [--batches-in-flight 2]
        [--ideal-batches-in-flight 1] [--wait-quiet SECONDS]

The reconciler runs with its CLI's defaults (lookups in flight, batches in flight) and
the ideal's batch size.

Starts the sandbox, an embedded Tansu and a relay (which publishes what the reconciler
writes to the outbox) as processes. Each round gets its own ``result_unknown`` calls
(no provider id: each is found by its idempotency key, as after a lost response), one
request per key applied at the sandbox first. Both reconcilers run in this process,
on uvloop as the reconciler's CLI does, one after the other; a round's calls/s is its
calls over its pass, its CPU what this process, PostgreSQL, the relay, the broker and
the sandbox used from the start of the pass until the relay published the round's
outbox rows, divided by its calls. With --rounds, every pair is measured again, the
order of the two reversed each round, and the target's ratio at each size is the median
of the rounds' own (bench.dispatch_rounds). This process prepares its heap before its
loop, as the reconciler's CLI does (kit.heap); the ideal, in this process too, gains as
much.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import psutil  # type: ignore[import-untyped]
import psycopg
import uvloop
from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.cpu import (
    Round,
    Sampler,
    by_role,
    compare_rows,
    cpu_between,
    postmaster_of,
    role_of,
    role_rows,
    server_processes,
    with_children,
)
from bench.dispatch_rounds import median_line
from bench.harness import render_table, service_env, start_python
from bench.ideal_reconciler import settle_all
from bench.intake import wait_quiet
from bench.sandbox import _connection, start_sandbox
from devtools.databases import create_database, drop_database, unique_name
from devtools.embedded import Tansu, free_port
from devtools.registries import capability, registry_of, registry_toml
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db import migrate
from dispatcher.db.engine import engine_for, session_factory
from dispatcher.db.tables import tool_calls
from dispatcher.provider.transport import Transport
from dispatcher.settings import Settings, Topics
from kit.heap import prepare_service_heap
from reconciler import Reconciler
from reconciler.loop import BATCHES_IN_FLIGHT


async def _apply_at_sandbox(base: str, keys: list[str]) -> None:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        for start in range(0, len(keys), 500):
            replies = await asyncio.gather(
                *(
                    client.post("/v1/requests", json={"n": k}, headers={"Idempotency-Key": k})
                    for k in keys[start : start + 500]
                )
            )
            assert all(r.status_code == 200 for r in replies)


async def _lookup_round(run: Run, seconds: float, connections: int) -> Round:
    """The sandbox's own lookup rate, driven by this process's raw HTTP/1.1 client."""
    latencies: list[float] = []
    sampler = run.sampler("client", only="sandbox")
    sampler.sample()
    started = time.time()
    counts = await asyncio.gather(
        *(
            _connection(run.host, run.port, "lookup", time.perf_counter() + seconds, latencies)
            for _ in range(connections)
        )
    )
    elapsed = time.time() - started
    sampler.sample()
    return metered(
        f"sandbox lookups alone (raw client, {connections} conns)",
        sum(counts),
        elapsed,
        sampler,
        started,
        started + elapsed,
    )


def metered(
    name: str, calls: int, seconds: float, sampler: Sampler, start: float, end: float
) -> Round:
    cpu, other = cpu_between(sampler.samples, start, end)
    roles = by_role(sampler.samples, sampler.roles, start, end)
    return Round(name, calls, seconds, cpu, other, roles)


@dataclass
class Run:
    url: str
    database: str
    host: str
    port: int
    sessions: async_sessionmaker[AsyncSession]
    services: dict[str, int | None]
    """The relay, the broker and the sandbox, by role."""
    postmaster: int

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def sampler(self, me_as: str, only: str | None = None) -> Sampler:
        """This process (as ``me_as``), the services (or the ``only`` one), PostgreSQL;
        sampled at the start and the end of a round only, so that no sampling thread
        runs beside the reconciler in this process."""
        me = psutil.Process()
        named = {pid: role for role, pid in self.services.items() if pid is not None}
        named[me.pid] = me_as
        if only is not None:
            pids = [self.services[only]]
            return Sampler(lambda: [me, *with_children(pids)], role=lambda p: role_of(p, named))
        return Sampler(
            lambda: [
                me,
                *with_children(self.services.values()),
                *server_processes(self.postmaster, self.database),
            ],
            role=lambda p: role_of(p, named),
        )

    async def prepare(self, keys: list[str]) -> None:
        """``keys`` applied at the sandbox, and a due ``result_unknown`` call for each."""
        await _apply_at_sandbox(self.base, keys)
        async with self.sessions() as session, session.begin():
            for start in range(0, len(keys), 1000):
                await session.execute(
                    insert(tool_calls).values(
                        [
                            {
                                "tool_call_id": f"tc-{uuid.uuid4().hex}",
                                "tenant": "bench",
                                "run_id": f"run-{i % 100}",
                                "capability_id": "refund",
                                "input": {"n": key},
                                "idempotency_key": key,
                                "provider_key": key,
                                "request_fingerprint": b"bench",
                                "status": "result_unknown",
                                "verification_status": "pending",
                                "reconciliation_status": "pending",
                                "dispatch_attempts": 1,
                                "dispatched_at": func.now(),
                                "next_reconcile_at": text("now() - interval '1 second'"),
                            }
                            for i, key in enumerate(keys[start : start + 1000], start)
                        ]
                    )
                )
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute("VACUUM ANALYZE tool_calls")
            await conn.execute("VACUUM ANALYZE outbox")

    async def _published(self, within: float = 600) -> None:
        """Until the relay published every outbox row."""
        deadline = time.monotonic() + within
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            while True:
                cursor = await conn.execute(
                    "SELECT count(*) FROM outbox WHERE published_at IS NULL"
                )
                if await cursor.fetchone() == (0,):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError("the relay did not publish the outbox")
                await asyncio.sleep(0.05)

    async def measure(
        self, name: str, prefix: str, settle: Callable[[], Awaitable[object]]
    ) -> Round:
        """Time ``settle()`` and meter the run's CPU until its outbox rows are out;
        its calls are those confirmed whose keys start with ``prefix``."""
        sampler = self.sampler("reconciler")
        sampler.sample()
        started = time.time()
        await settle()
        elapsed = time.time() - started
        await self._published()
        sampler.sample()
        async with self.sessions() as session:
            confirmed = (
                await session.execute(
                    select(func.count()).where(
                        tool_calls.c.status == "confirmed",
                        tool_calls.c.idempotency_key.like(f"{prefix}%"),
                    )
                )
            ).scalar_one()
        return metered(name, confirmed, elapsed, sampler, started, sampler.samples[-1].at)


async def run(args: argparse.Namespace, url: str, database: str) -> None:
    host, port = "127.0.0.1", free_port()
    server = await start_sandbox(port)
    broker = Tansu()
    bootstrap = broker.start()
    caps = Path(tempfile.mkdtemp()) / "capabilities.toml"
    registry = registry_of(
        capability("refund", f"http://{host}:{port}", timeout=None, attempts=None, by_key=True)
    )
    caps.write_text(registry_toml(registry))
    relay = await start_python(
        ["-m", "tool_dispatcher", "relay"], service_env(url, bootstrap, caps)
    )
    engine = engine_for(url, pool_size=10)
    services = {"relay": relay.pid, "broker": broker.pid, "sandbox": server.pid}
    run = Run(url, database, host, port, session_factory(engine), services, postmaster_of(url))
    try:
        # bench.sandbox's lookup client asks for keys warm:0..99.
        await _apply_at_sandbox(run.base, [f"warm:{i}" for i in range(100)])
        await _quiet(args)
        ceiling = await _lookup_round(run, args.seconds, args.connections)

        rounds: list[tuple[int, Round, Round]] = []
        async with Transport(args.concurrency) as transport:
            for r in range(args.rounds):
                for index, size in enumerate(args.calls):
                    # Fresh due calls for each, keyed by the round; the order reversed
                    # from one round to the next.
                    tag = f"{r}.{index}.{size}"
                    ideal = partial(_ideal, run, args, size, tag)
                    ours = partial(_ours, run, args, registry, transport, size, tag)
                    if r % 2:
                        o = await ours()
                        rounds.append((size, await ideal(), o))
                    else:
                        i = await ideal()
                        rounds.append((size, i, await ours()))
        async with httpx.AsyncClient() as client:
            effects = (await client.get(f"{run.base}/v1/effects")).json()
    finally:
        await engine.dispose()
        relay.terminate()
        await relay.wait()
        server.terminate()
        await server.wait()
        broker.stop()
        shutil.rmtree(caps.parent, ignore_errors=True)

    for size, ideal, ours in rounds:
        for r in (ideal, ours):
            assert r.calls == size, f"{r.name}: {r.calls} of {size} confirmed"
    print()
    print(f"{psutil.cpu_count()} cores; load average {os.getloadavg()} at the end")
    header = [
        "round",
        "calls",
        "calls/s",
        "CPU µs/call",
        "calls/s vs ideal",
        "CPU vs ideal",
        "target calls/s",
        "rest of machine µs/call",
    ]
    for size, ideal, ours in rounds:
        print(f"\n{size:,} due calls")
        rows = compare_rows([ceiling, ideal, ours], ideal, targeted=[ours.name], min_rate=TARGET)
        print(render_table(rows, header, markdown=True))
        print()
        header_roles, role_table = role_rows([ideal, ours])
        print(render_table(role_table, header_roles, markdown=True))
    print()
    for size in dict.fromkeys(args.calls):
        ratios = [o.rate / i.rate for s, i, o in rounds if s == size]
        label = f"reconciler / ideal at {size:,} due calls, calls/s"
        print(median_line(label, ratios, f">= {TARGET}x", TARGET, above=True))
    most = max(effects["effects"].values())
    print(f"\nsandbox's maximum effects per key: {most} (must be 1)")
    if most != 1:
        raise SystemExit("AN EFFECT HAPPENED TWICE")


IDEAL = "ideal reconciler (bench.ideal_reconciler"
TARGET = 0.9
"""The reconciler's calls/s against the ideal's, at every backlog size."""


async def _ideal(run: Run, args: argparse.Namespace, size: int, tag: str) -> Round:
    await run.prepare([f"ri{tag}:{i}" for i in range(size)])
    lookup_url = f"{run.base}/v1/requests"
    await _quiet(args)
    conns = [
        await psycopg.AsyncConnection.connect(run.url, autocommit=True)
        for _ in range(args.ideal_batches_in_flight)
    ]
    try:
        return await run.measure(
            f"{IDEAL}, {args.ideal_batches_in_flight} batch(es) in flight)",
            f"ri{tag}:",
            lambda: settle_all(conns, lookup_url, batch=args.batch_size),
        )
    finally:
        for conn in conns:
            await conn.close()


async def _ours(
    run: Run,
    args: argparse.Namespace,
    registry: CapabilityRegistry,
    transport: Transport,
    size: int,
    tag: str,
) -> Round:
    await run.prepare([f"rt{tag}:{i}" for i in range(size)])
    reconciler = Reconciler(
        run.sessions,
        registry,
        transport,
        topics=Topics(events="bench.events", escalations="bench.escalations"),
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        batches_in_flight=args.batches_in_flight,
    )
    await _quiet(args)
    return await run.measure(
        f"tool-dispatcher reconciler (batch {args.batch_size}, {args.concurrency} "
        f"lookups, {args.batches_in_flight} batches in flight)",
        f"rt{tag}:",
        reconciler.run_pass,
    )


async def _quiet(args: argparse.Namespace) -> None:
    if args.wait_quiet:
        await wait_quiet(args.wait_quiet)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reconcile", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--calls",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[3_000, 10_000],
        help="due calls of a pass, comma-separated: a pair of rounds for each",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="pairs at each size, the order reversed each round; the target's ratio is "
        "the median of the rounds' own",
    )
    parser.add_argument("--batch-size", type=int, default=500)
    # The reconciler's own defaults, as its CLI runs it.
    parser.add_argument("--concurrency", type=int, default=Settings().reconcile_concurrency)
    parser.add_argument("--batches-in-flight", type=int, default=BATCHES_IN_FLIGHT)
    parser.add_argument(
        "--ideal-batches-in-flight",
        type=int,
        default=1,
        help="the ideal's; measured at 10,000 calls, 3 cost PostgreSQL about 4x the CPU "
        "per call of 1 (concurrent claims over the same due index) and settled fewer calls/s",
    )
    parser.add_argument("--connections", type=int, default=32, help="raw lookup clients")
    parser.add_argument("--seconds", type=float, default=3.0, help="raw lookup window")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each round, wait up to this long for the rest of the machine to idle",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    scratch = unique_name("bench_reconcile")
    url = create_database(args.database_url, scratch)
    try:
        migrate.upgrade(url)
        # As the reconciler's CLI: its heap prepared (kit.heap), and uvloop (tool_dispatcher).
        prepare_service_heap()
        uvloop.run(run(args, url, scratch))
    finally:
        drop_database(args.database_url, scratch)


if __name__ == "__main__":
    main()
