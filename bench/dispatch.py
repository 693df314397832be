"""Dispatch throughput: calls per second that 1 and 2 worker processes take from
``authorized`` to ``completed`` against the sandbox provider (zero latency), next to
the sandbox's own request rate measured in the same run. Target: >= 0.5x.

    .venv/bin/python -m bench.dispatch [--calls 5000] [--database-url URL]
        [--set worker_concurrency=256 --set provider_max_connections=8 ...]

Creates (and drops) a scratch database on the server named by --database-url, starts
an embedded Tansu, the sandbox and a relay as processes, pre-publishes the dispatch
commands, then times the workers from the first claim to the last recorded outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg

from bench.sandbox import measure, start_sandbox
from dispatcher.capabilities import load_registry
from dispatcher.db import migrate
from dispatcher.db.engine import engine_for, session_factory
from dispatcher.intake.service import submit_many
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import Topics
from dispatcher.testing.databases import create_database, drop_database, unique_name
from dispatcher.testing.embedded import Tansu, free_port
from dispatcher.testing.registries import refund_and_lookup, registry_toml


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


def scalar(url: str, sql: str) -> object:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql).fetchone()  # type: ignore[arg-type]
        return row[0] if row else None


async def wait_for(url: str, sql: str, want: object, within: float = 600) -> None:
    deadline = time.monotonic() + within
    while scalar(url, sql) != want:
        if time.monotonic() > deadline:
            raise TimeoutError(sql)
        await asyncio.sleep(0.2)


async def run_workers(url: str, env: dict[str, str], workers: int, n: int, tag: str) -> float:
    """Calls per second from the first claim to the last outcome of this round."""
    topic = f"bench-commands-{tag}"
    caps = Path(env["TOOL_DISPATCHER_CAPABILITIES_FILE"])
    await prefill(url, caps, n, topic, tag)
    round_env = {
        **env,
        "TOOL_DISPATCHER_DISPATCH_TOPIC": topic,
        "TOOL_DISPATCHER_WORKER_GROUP_ID": f"bench-{tag}",
    }
    await wait_for(
        url, f"SELECT count(*) FROM outbox WHERE published_at IS NULL AND topic = '{topic}'", 0
    )
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dispatcher",
            "worker",
            env=round_env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    try:
        await wait_for(
            url,
            "SELECT count(*) FROM tool_calls WHERE status = 'completed' "
            f"AND idempotency_key LIKE '{tag}:%'",
            n,
        )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            await p.wait()
    span = scalar(
        url,
        "SELECT extract(epoch FROM max(updated_at) - min(dispatched_at)) "
        f"FROM tool_calls WHERE idempotency_key LIKE '{tag}:%'",
    )
    return n / float(span)  # type: ignore[arg-type]


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
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")},
        "TOOL_DISPATCHER_DATABASE_URL": url,
        "TOOL_DISPATCHER_KAFKA_BOOTSTRAP": bootstrap,
        "TOOL_DISPATCHER_KAFKA_ENABLE_IDEMPOTENCE": "false",
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(caps),
    }
    for setting in args.set:
        name, _, value = setting.partition("=")
        env[f"TOOL_DISPATCHER_{name.upper()}"] = value
    relay = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatcher",
        "relay",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        total, elapsed, _ = await measure(
            "127.0.0.1", port, mode="create", connections=32, seconds=args.seconds
        )
        ceiling = total / elapsed
        async with httpx.AsyncClient() as client:
            await client.post(f"{sandbox_url}/v1/reset")
            rates = {w: await run_workers(url, env, w, args.calls, f"w{w}") for w in (1, 2)}
            effects = (await client.get(f"{sandbox_url}/v1/effects")).json()
        assert max(effects["effects"].values()) == 1, "an effect happened twice"
    finally:
        relay.terminate()
        await relay.wait()
        sandbox.terminate()
        await sandbox.wait()
        broker.stop()
        shutil.rmtree(caps.parent, ignore_errors=True)
        drop_database(args.database_url, scratch)

    print()
    print(f"sandbox's own request rate (32 keep-alive clients): {ceiling:,.0f} req/s")
    print("| workers | calls | dispatched calls/s | ratio to sandbox | target 0.5x |")
    print("|---|---|---|---|---|")
    for workers, rate in rates.items():
        ratio = rate / ceiling
        print(
            f"| {workers} | {args.calls} | {rate:,.0f} | {ratio:.2f}x | "
            f"{'PASS' if ratio >= 0.5 else 'MISS'} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m bench.dispatch", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=5.0, help="sandbox measurement")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the relay and the workers, e.g. worker_concurrency=256",
    )
    asyncio.run(main(parser.parse_args()))
