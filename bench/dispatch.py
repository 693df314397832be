"""Dispatch throughput and machine CPU per call, in one run against one sandbox, one
broker (an embedded Tansu) and one scratch database: the sandbox's own request rate,
a minimal ideal worker (bench.ideal_worker) on the project's table, a lean ideal worker
on a table of its own (bench.lean_worker: the second ceiling), and tool-dispatcher with
1 and 2 worker processes. Targets: 1 worker at >= 0.5x each ideal's calls/s, and at
most 2x its machine CPU per call.

    .venv/bin/python -m bench.dispatch [--calls 5000] [--rounds 3] [--database-url URL]
        [--set worker_concurrency=256 --set provider_max_connections=8 ...]
        [--wait-quiet SECONDS]

Creates (and drops) a scratch database on the server named by --database-url, starts
an embedded Tansu, the sandbox and a relay as processes; each round has its own fresh
calls, topic and consumer group, its dispatch commands published before its workers
start. A round's calls/s is its calls over the database's span from the first claim
to the last outcome; its CPU is what every process of the run (bench.cpu.Sampler:
the workers, the relay, PostgreSQL, the broker, the sandbox) used from that first
claim until the last outcome or, when later, the relay's last publish of the round's
outbox rows, divided by its calls. With --rounds, every ceiling and worker round is
measured again, the order reversed each time, and the targets' ratios are the medians
of the rounds' own (bench.dispatch_rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]
import psycopg

from bench import lean_worker
from bench.cpu import (
    Rescanned,
    Round,
    Sampler,
    by_role,
    compare_rows,
    cpu_between,
    postmaster_of,
    processes,
    role_of,
    role_rows,
    server_processes,
    with_children,
)
from bench.dispatch_rounds import median_ratios, schedule
from bench.harness import render_table, service_env, start_python, stop_process
from bench.intake import wait_quiet
from bench.sandbox import measure, start_sandbox
from devtools.databases import create_database, drop_database, unique_name
from devtools.embedded import Tansu, free_port
from devtools.registries import refund_and_lookup, registry_toml
from dispatcher.capabilities import load_registry
from dispatcher.db import migrate
from dispatcher.db.engine import engine_for, session_factory
from dispatcher.intake.service import submit_many
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import Topics


async def prefill(url: str, caps: Path, n: int, topic: str, tag: str) -> None:
    engine = engine_for(url)
    sessions = session_factory(engine)
    registry = load_registry(caps)
    for start in range(0, n, 500):
        items = [
            (
                SubmitRequest(
                    run_id=f"run-{i % 100}",
                    capability_id="refund",
                    idempotency_key=f"{tag}:{i}",
                    input={"orderId": i},
                ),
                "bench",
            )
            for i in range(start, min(n, start + 500))
        ]
        async with sessions() as session, session.begin():
            await submit_many(session, items, registry=registry, topics=Topics(dispatch=topic))
    await engine.dispose()


class Poll:
    """One autocommit connection for the benchmark's own queries: a connection per
    poll would fork a backend each time, on the CPU being measured."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        self.backend: int = self.scalar("SELECT pg_backend_pid()")
        """Its server process: the harness's, left out of the run's CPU."""

    def row(self, sql: str) -> tuple[Any, ...]:
        row = self._conn.execute(sql).fetchone()  # type: ignore[arg-type]
        assert row is not None, sql
        return tuple(row)

    def scalar(self, sql: str) -> Any:
        return self.row(sql)[0]

    async def wait_for(self, sql: str, want: object, within: float = 600) -> None:
        deadline = time.monotonic() + within
        while self.scalar(sql) != want:
            if time.monotonic() > deadline:
                raise TimeoutError(sql)
            await asyncio.sleep(0.25)

    def close(self) -> None:
        self._conn.close()


@dataclass
class Run:
    """What every round shares: the database, the services' processes, the settings."""

    url: str
    database: str
    env: dict[str, str]
    poll: Poll
    services: dict[str, int | None]
    """The relay, the broker and the sandbox, by role."""
    postmaster: int
    wait_quiet: float = 0.0

    def sampler(self, spawned: list[int]) -> Sampler:
        """Samples every process of the run: the services, the round's processes (each
        sample: cheap), their children and PostgreSQL's (a scan of the machine's
        processes, once a second; see :class:`Rescanned`)."""
        known: dict[int, psutil.Process] = {}
        pids = lambda: [*self.services.values(), *spawned]  # noqa: E731
        scan = Rescanned(
            lambda: [
                *with_children(pids()),
                *server_processes(self.postmaster, self.database, [self.poll.backend]),
            ],
            seconds=1.0,
        )
        named = {pid: role for role, pid in self.services.items() if pid is not None}
        return Sampler(
            lambda: [*processes(pids(), known), *scan()],
            role=lambda p: role_of(p, {**named, **dict.fromkeys(spawned, "worker")}),
        )


async def run_round(run: Run, name: str, argv: list[list[str]], n: int, tag: str) -> Round:
    """Prefill ``n`` calls whose commands go to this round's topic, start the
    processes ``argv`` (given the topic and the group), and measure until every call
    is completed and the round's outbox rows are published."""
    topic, group = f"bench-commands-{tag}", f"bench-{tag}"
    await prefill(run.url, Path(run.env["TOOL_DISPATCHER_CAPABILITIES_FILE"]), n, topic, tag)
    unpublished = "SELECT count(*) FROM outbox WHERE published_at IS NULL"
    await run.poll.wait_for(unpublished, 0)
    round_env = {
        **run.env,
        "TOOL_DISPATCHER_DISPATCH_TOPIC": topic,
        "TOOL_DISPATCHER_WORKER_GROUP_ID": group,
    }
    if run.wait_quiet:
        await wait_quiet(run.wait_quiet)
    spawned: list[int] = []
    sampler = run.sampler(spawned).start()
    procs = []
    try:
        for args in argv:
            args = [a.format(topic=topic, group=group) for a in args]
            proc = await start_python(args, round_env)
            procs.append(proc)
            spawned.append(proc.pid)
        mine = f"idempotency_key LIKE '{tag}:%'"
        # Only this round's calls are open; the partial indexes of both statuses make
        # this poll cheap (a LIKE on the key would scan every round's rows each time).
        open_calls = "SELECT count(*) FROM tool_calls WHERE status IN ('authorized', 'dispatching')"
        await run.poll.wait_for(open_calls, 0)
        await run.poll.wait_for(unpublished, 0)
    finally:
        samples = sampler.stop()
        # A process that ended during the round is named, not hidden behind the
        # ProcessLookupError its SIGTERM would raise.
        early = [(p.pid, p.returncode) for p in procs if p.returncode is not None]
        for p in procs:
            await stop_process(p)
    if early:
        raise RuntimeError(f"{name}: (pid, exit code) ended during the round: {early}")
    first, last = map(
        float,
        run.poll.row(
            "SELECT extract(epoch FROM min(dispatched_at)), extract(epoch FROM max(updated_at))"
            f" FROM tool_calls WHERE {mine}"
        ),
    )
    published = run.poll.scalar(
        "SELECT extract(epoch FROM max(published_at)) FROM outbox "
        f"WHERE created_at >= to_timestamp({first})"
    )
    end = max(last, float(published or last))
    cpu, other = cpu_between(samples, first, end)
    completed = run.poll.scalar(
        f"SELECT count(*) FROM tool_calls WHERE status = 'completed' AND {mine}"
    )
    if completed != n:
        print(f"!! {name}: only {completed} of {n} calls completed (the rest in doubt or failed)")
    roles = by_role(samples, sampler.roles, first, end)
    return Round(name, completed, last - first, cpu, other, roles)


async def lean_round(run: Run, n: int, sandbox_url: str, tag: str) -> Round:
    """``n`` calls in the lean ideal's own table (emptied first), all waiting, keyed
    ``<tag>:<i>``, and its process started: measured as a worker round is, from its
    first claim to its last outcome."""
    async with await psycopg.AsyncConnection.connect(run.url, autocommit=True) as conn:
        await conn.execute(lean_worker.TABLE)
        await conn.execute(lean_worker.INDEX)
        await conn.execute("TRUNCATE lean_calls")
        await conn.execute(
            "INSERT INTO lean_calls (id, status, key) "
            "SELECT i, 'authorized', %s || ':' || i FROM generate_series(1, %s) AS i",
            (tag, n),
        )
    if run.wait_quiet:
        await wait_quiet(run.wait_quiet)
    spawned: list[int] = []
    sampler = run.sampler(spawned).start()
    argv = ["-m", "bench.lean_worker", "--database-url", run.url, "--url",
            f"{sandbox_url}/v1/requests"]  # fmt: skip
    proc = await start_python(argv, run.env)
    spawned.append(proc.pid)
    try:
        waiting = "SELECT count(*) FROM lean_calls WHERE status IN ('authorized', 'dispatching')"
        await run.poll.wait_for(waiting, 0)
    finally:
        samples = sampler.stop()
        proc.terminate()
        await proc.wait()
    first, last = map(
        float,
        run.poll.row(
            "SELECT extract(epoch FROM min(dispatched_at)), extract(epoch FROM max(completed_at))"
            " FROM lean_calls"
        ),
    )
    cpu, other = cpu_between(samples, first, last)
    completed = run.poll.scalar("SELECT count(*) FROM lean_calls WHERE status = 'completed'")
    roles = by_role(samples, sampler.roles, first, last)
    return Round(LEAN, completed, last - first, cpu, other, roles)


async def sandbox_round(run: Run, port: int, seconds: float) -> Round:
    """The sandbox's own rate, driven by this process's raw HTTP/1.1 client (counted
    with it: the client is part of that run)."""
    me = psutil.Process()
    sandbox = with_children([run.services["sandbox"]])
    sampler = Sampler(
        lambda: [me, *sandbox], role=lambda p: "client" if p.pid == me.pid else "sandbox"
    ).start()
    started = time.time()
    total, elapsed, _ = await measure(
        "127.0.0.1", port, mode="create", connections=32, seconds=seconds
    )
    samples = sampler.stop()
    end = started + elapsed
    cpu, other = cpu_between(samples, started, end)
    roles = by_role(samples, sampler.roles, started, end)
    return Round("sandbox alone (raw client, 32 conns)", total, elapsed, cpu, other, roles)


def rounds_table(rounds: list[Round], ideal: Round, one_worker: str) -> str:
    header = [
        "round",
        "calls",
        "calls/s",
        "CPU µs/call",
        "calls/s vs ideal",
        "CPU vs ideal",
        "target calls/s",
        "target CPU",
        "rest of machine µs/call",
    ]
    rows = compare_rows(rounds, ideal, targeted=[one_worker], min_rate=0.5, max_cpu=2.0)
    return render_table(rows, header, markdown=True)


IDEAL = "ideal worker (bench.ideal_worker)"
LEAN = "lean ideal worker (bench.lean_worker)"
ONE = "tool-dispatcher, 1 worker"
TWO = "tool-dispatcher, 2 workers"


async def main(args: argparse.Namespace) -> None:
    scratch = unique_name("td_bench_dispatch")
    url = create_database(args.database_url, scratch)
    migrate.upgrade(url)
    broker = Tansu()
    bootstrap = broker.start()
    port = free_port()
    sandbox = await start_sandbox(port)
    sandbox_url = f"http://127.0.0.1:{port}"
    caps = Path(tempfile.mkdtemp()) / "capabilities.toml"
    caps.write_text(registry_toml(refund_and_lookup(sandbox_url, timeout=5.0, attempts=3)))
    env = service_env(url, bootstrap, caps)
    for setting in args.set:
        name, _, value = setting.partition("=")
        env[f"TOOL_DISPATCHER_{name.upper()}"] = value
    relay = await start_python(["-m", "tool_dispatcher", "relay"], env)
    poll = Poll(url)
    services = {"relay": relay.pid, "broker": broker.pid, "sandbox": sandbox.pid}
    run = Run(url, scratch, env, poll, services, postmaster_of(url), args.wait_quiet)
    ideal = [
        "-m",
        "bench.ideal_worker",
        "--database-url",
        url,
        "--bootstrap",
        bootstrap,
        "--topic",
        "{topic}",
        "--group",
        "{group}",
        "--url",
        f"{sandbox_url}/v1/requests",
    ]
    worker = ["-m", "tool_dispatcher", "worker"]
    try:
        if args.wait_quiet:
            await wait_quiet(args.wait_quiet)
        ceiling = await sandbox_round(run, port, args.seconds)
        async with httpx.AsyncClient() as client:
            await client.post(f"{sandbox_url}/v1/reset")
            argv = {IDEAL: ([ideal], "ideal"), ONE: ([worker], "w1"), TWO: ([worker] * 2, "w2")}
            measured: list[dict[str, Round]] = [{} for _ in range(args.rounds)]
            for r, name in schedule([LEAN, IDEAL, ONE, TWO], args.rounds):
                if name == LEAN:
                    measured[r][name] = await lean_round(run, args.calls, sandbox_url, f"lean{r}")
                else:
                    procs, tag = argv[name]
                    measured[r][name] = await run_round(run, name, procs, args.calls, f"{tag}{r}")
            effects = (await client.get(f"{sandbox_url}/v1/effects")).json()
    finally:
        poll.close()
        relay.terminate()
        await relay.wait()
        sandbox.terminate()
        await sandbox.wait()
        broker.stop()
        shutil.rmtree(caps.parent, ignore_errors=True)
        drop_database(args.database_url, scratch)

    print()
    print(f"{psutil.cpu_count()} cores; load average {os.getloadavg()} at the end")
    for r, by_name in enumerate(measured):
        if args.rounds > 1:
            print(f"\nround {r + 1} of {args.rounds}")
        print_round(ceiling, by_name)
    if args.rounds > 1:
        print()
        for ceiling_name in (IDEAL, LEAN):
            for line in median_ratios(measured, ONE, ceiling_name, min_rate=0.5, max_cpu=2.0):
                print(line)
    most = max(effects["effects"].values())
    print(
        f"\nsandbox's maximum effects per key: {most} (must be 1), "
        f"{effects['total']:,} effects in all"
    )
    if most != 1:
        twice = [k for k, v in effects["effects"].items() if v > 1]
        raise SystemExit(f"AN EFFECT HAPPENED TWICE: {len(twice)} keys, e.g. {twice[:5]}")


def print_round(ceiling: Round, by_name: dict[str, Round]) -> None:
    """One round's tables: against the ideal, against the lean ideal, CPU by process."""
    lean, rounds = by_name[LEAN], [by_name[n] for n in (IDEAL, ONE, TWO)]
    print(rounds_table([ceiling, lean, *rounds], by_name[IDEAL], ONE))
    print()
    print("against the lean ideal (the second ceiling):")
    print(rounds_table([lean, *rounds], lean, ONE))
    print()
    header, rows = role_rows([ceiling, lean, *rounds])
    print(render_table(rows, header, markdown=True))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m bench.dispatch", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=5.0, help="sandbox measurement")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure the ideals and the workers this many times, the order reversed each "
        "round; ratios are the medians of the rounds' own",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each round, wait up to this long for the rest of the machine to idle",
    )
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the relay and the workers, e.g. worker_concurrency=256",
    )
    parsed = parser.parse_args()
    if parsed.rounds < 1:
        parser.error("--rounds must be at least 1")
    asyncio.run(main(parsed))
